"""jobctl.engine.cli: the ``jobctl`` command line, one module per command group.

``app`` builds the Typer app and is the console script's entry point
(``python -m jobctl.engine.cli.app``); ``lazy`` holds the command table, whose modules
load only when their command runs (so ``--help``, ``validate``, ``status``, ``logs``,
``events`` and ``schema`` never import torch). Each command module parses its arguments, asks
the layers below (engine/supervise/service.py and run_requests.py for a run's life,
the planner, the fleet and the scheduler) and prints through engine/views:

* ``plan``: validate, schema, plan (with the pruning and rebalancing previews), render;
* ``calibrate``: measure the model and this machine;
* ``apply``: apply and resume, in the foreground or detached;
* ``runs``: stop, status, logs, events; ``scale``: morph a run; ``report``: the HTML page;
* ``fleet``, ``schedule``: fleets, schedules, the scheduler daemon;
* ``common``: shared options, consoles and exit-2 look-ups; ``backend``: backend errors.

In layer 10 of ``engine.LAYERS``: it may import the layers below (core to views);
``jobctl.backends`` only through its registry.
"""
