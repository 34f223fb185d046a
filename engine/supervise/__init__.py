"""jobctl.engine.supervise: a run's life, from launch to its end, and what it decides.

``supervisor`` walks one run through its phases as a state machine (calibrate, plan,
launch, train, morph, finish); ``launch`` writes each attempt's folder and node
scripts, ``attempt`` starts its processes, ``monitor`` follows its nodes and how it
ended, ``records`` mirrors the workers' records (engine/core/events.py) into the state
DB, ``activity`` turns them into phases. ``crash`` tells a bug from a lost process,
``recovery`` times recoveries and counts the steps they lost, ``handover`` lets the
survivors of a lost node write the step they hold before the rest is torn down,
``reform`` re-forms them in place (the re-planned layout on the surviving nodes, the
word, their answers; ``in_place``: the supervisor's steps for it, ``in_place_watch``
the monitor's),
``stragglers`` flags slow devices, ``scaling`` reads
scale requests and plans the next attempt, ``budget`` holds a run to ``spec.budget``
(stop at the total cap, morph down at the hourly cap), ``adoption`` re-attaches a run whose
supervisor died. ``service`` and ``run_requests`` are the decisions the command line
asks for (apply, resume, stop, scale), ``run_logs`` finds a run's log files;
``figures`` and ``report_data`` compute what ``jobctl status`` and ``jobctl report`` show.

In layer 7 of ``engine.LAYERS``: it may import the layers below (core to worker and
calibration.measure); ``jobctl.backends`` only through its registry.
"""
