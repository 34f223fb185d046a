"""Shared code of the benchmarks (not benchmarks themselves): real runs of a plan and
the machine's load (``jobbench``), local S3 and hand-built rank processes (``benchlib``,
``torch_pipeline_worker``), decision metrics, test models, and dated result files
(``results``)."""
