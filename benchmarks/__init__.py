"""jobctl's benchmarks: each judges one claim of the product against a baseline measured
in the same run. ``python -m benchmarks list`` names them, ``run NAME`` runs one
(``__main__``); grouped by what they judge (``planner``, ``runtime``, ``recovery``,
``io``, ``papers``, ``gpu``), shared code in ``lib``, dated results in ``results/``."""
