"""jobctl.engine.state: the state database every jobctl process shares.

``db`` keeps runs and their events (phase transitions are compare-and-set, so two
supervisors never both move a run out of a phase); ``leases`` keeps who may launch a
job and the control events of schedules and fleets; ``reader`` reads a SQLite one
through ``sqlite3`` for the commands that only look (no SQLAlchemy import, a bounded
wait for a lock) and holds ``StateDBError``. The state home itself (the folder
that holds the database) is engine/core/home.py.

In layer 4 of ``engine.LAYERS`` (with runtime, checkpoint and channel): it may import
the layers below (core to planner) and, without a cycle, the rest of its own.
"""
