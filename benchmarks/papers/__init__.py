"""Reproductions of published results: Varuna's Table 7 and simulator times, Megatron-LM
v1.0's iteration, priced by jobctl's device model."""
