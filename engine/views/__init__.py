"""jobctl.engine.views: rendering only, of data the layers below computed.

Views never import torch and take from the rest of jobctl only types and constants
(tests/unit/test_layers.py checks it): the command line computes, then hands the data
over. ``tables`` (plans, calibrations, runs), ``fleet``, ``pruning``, ``rebalance`` and
``cost`` (dollars to finish, the time-vs-dollars frontier) print to the terminal;
``gantt`` draws a simulated step (``mobius_gantt``: a Mobius step with its swaps, as
80-column lanes or a figure); ``svg`` and ``png`` draw charts; ``report`` writes
the HTML page of ``jobctl report``. ``prose`` is the CLI's console (prose wrapped
between words at a terminal, whole in a pipe); ``markup`` the one place markup is parsed.

In layer 9 of ``engine.LAYERS``: it may import the layers below (core to fleet and
scheduler).
"""
