from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


def apply_fsdp(model, dp_mesh, param_dtype, reduce_dtype):
    mp_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    for layer_id, block in model.layers.items():
        reshard = int(layer_id) < len(model.layers) - 1
        fully_shard(block, mesh=dp_mesh, mp_policy=mp_policy, reshard_after_forward=reshard)
    fully_shard(model, mesh=dp_mesh, mp_policy=mp_policy, reshard_after_forward=True)
    return model
