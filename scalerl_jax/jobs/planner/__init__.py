"""The planner and the TPU compile check: does a config fit, and on what.

`plan.py` counts memory and FLOPs per device on a named accelerator with no
device and no compiler; `aot.py` compiles the run's programs for a TPU slice
and sets the compiler's bytes against the planner's. Design:
docs/design/planner.md.
"""
