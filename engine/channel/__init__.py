"""jobctl.engine.channel: the run host and the event channel workers report through.

``host`` is the detached run host of an attempt (``python -m
jobctl.engine.channel.host``): the rendezvous store and the channel server, alive while
a supervisor or its workers need them, published in ``host.json``; ``server`` archives
the batches of events that workers post over HTTP into ``metrics.jsonl`` (each once, in
order, behind the run's secret); ``client`` is a worker's side, queueing events and
posting them from a thread (or the file sink without a channel); ``liveness`` names the
nodes whose heartbeats stopped.

In layer 4 of ``engine.LAYERS`` (with runtime, checkpoint and state): it may import the
layers below (core to planner) and, without a cycle, the rest of its own.
"""
