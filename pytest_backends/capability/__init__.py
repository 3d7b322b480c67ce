"""CPU capability levels: a process-level axis run on pytest-xdist workers."""
