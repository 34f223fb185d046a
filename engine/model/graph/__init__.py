"""jobctl.engine.model.graph: unmodified models, traced and sharded (Merak sec. 4).

``source`` builds a user's model (an import factory or a Hugging Face class, from a
config or a local pretrained directory) with its parameters on the meta device;
``trace`` turns it into one graph with ``torch.export``; ``shard`` cuts the graph
into a sequence of subgraphs with Merak's dependency search and graph sharding
(Alg. 1 and 2); ``subgraph`` makes each one a module that materialises only its own
parameters; ``boundary`` packs the several tensors that cross a cut into one message;
``batch`` maps token batches to the model's keyword arguments; ``graph_def`` ties it
together as a ``ModelDef`` whose blocks are the subgraphs. Tensor parallelism (Merak
4.1): ``tp_features``, ``tp_plan``, ``tp_stage`` (a stage split on its T group) and
``tp_subpipeline`` (sec. 5.3: a split subgraph's micro-batch as two halves through its
m/2 twin, one all-reducing while the other computes).
"""
