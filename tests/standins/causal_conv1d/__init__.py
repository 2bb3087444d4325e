"""A stand-in for the causal-conv1d kernels (no CPU build exists): records its arguments."""
SEEN = []

def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                     final_states_out=None, activation=None):
    SEEN.append({"fn": "conv", "seq_idx": None if seq_idx is None else str(seq_idx.device)})
    return x.clone()

def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None, conv_state_indices=None):
    SEEN.append({"fn": "update"})
    return x.clone()
