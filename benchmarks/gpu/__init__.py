"""The GPU check and GPU accuracy benchmarks: run on a CUDA machine (``gpu_check.sh``); the
specs it applies (``apply.yaml``, ``mobius.yaml``) live here too."""
