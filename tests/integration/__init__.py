"""Multi-process, chaos, S3, Slurm and ssh tests (marked)."""
