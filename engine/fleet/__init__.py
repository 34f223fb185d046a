"""jobctl.engine.fleet: many runs of one job spec template sharing a device pool.

``spec`` is the fleet file (a template plus parameter sets), ``loader`` validates it
and renders each member's job spec, ``planning`` plans and prices every member,
``db`` keeps fleets and members in the state DB, ``runner`` admits members into the
pool and supervises them (surviving its own kill), ``members`` joins members with
their runs for ``jobctl fleet status``, ``stopping`` stops a fleet (``jobctl fleet stop``).

In layer 8 of ``engine.LAYERS`` (with scheduler): it may import the layers below (core
to supervise) and, without a cycle, the rest of its own.
"""
