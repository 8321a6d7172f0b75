"""Pipeline chains over heterogeneous GPUs (seed 003); filled in with pipeline pools."""
