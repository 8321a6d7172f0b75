"""Local policies: the order in which one engine admits waiting requests."""

from fairpool.sched.policies.baselines import AlphaProtection, Sarathi
from fairpool.sched.policies.dlpm import DLPM
from fairpool.sched.policies.fcfs import FCFS
from fairpool.sched.policies.lpm import LPM
from fairpool.sched.policies.mcsf import MCSF
from fairpool.sched.policies.rad import RAD
from fairpool.sched.policies.slai import SLAI
from fairpool.sched.policies.vtc import VTC

__all__ = ["DLPM", "FCFS", "LPM", "MCSF", "RAD", "SLAI", "VTC", "AlphaProtection", "Sarathi"]
