"""`fairpool engine-sim`: an OpenAI-compatible server with vLLM's HTTP surface, serving a
simulated engine (`fairpool.sim.engine.SimEngine`) in wall-clock time. Imports no vLLM.
"""
