"""The transformers engine's CPU fast paths give the same numbers as transformers' own: the key/value cache that
appends into spare room, and SDPA attention with grouped key/value heads under a padding mask."""
import types

import torch

from mascot.core.engine.transformers import KV_ROOM, _kv_cache, gqa_sdpa_attention


def test_growing_cache_matches_concatenation_and_reuses_its_buffer():
    torch.manual_seed(0)
    first = [(torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4)) for _ in range(2)]
    cache = _kv_cache(first)
    ref = [[k.clone(), v.clone()] for k, v in first]
    ptrs = set()
    for step in range(KV_ROOM + 3):  # past the room: one reallocation
        add = 1 if step % 5 else 3  # jump-forward steps feed several columns
        for i, layer in enumerate(cache.layers):
            k, v = torch.randn(2, 3, add, 4), torch.randn(2, 3, add, 4)
            keys, values = layer.update(k, v)
            ref[i][0], ref[i][1] = torch.cat([ref[i][0], k], 2), torch.cat([ref[i][1], v], 2)
            assert torch.equal(keys, ref[i][0]) and torch.equal(values, ref[i][1])
        ptrs.add(cache.layers[0].keys.data_ptr())
    assert len(ptrs) <= 3  # appends in place; a new buffer only when the room runs out
    assert cache.get_seq_length() == ref[0][0].shape[2]


def test_growing_cache_after_rows_are_selected():
    torch.manual_seed(1)
    cache = _kv_cache([(torch.randn(3, 2, 4, 8), torch.randn(3, 2, 4, 8))])
    layer = cache.layers[0]
    layer.update(torch.randn(3, 2, 1, 8), torch.randn(3, 2, 1, 8))
    before = layer.keys.clone()
    cache.batch_select_indices(torch.tensor([0, 2]))  # a row finished: the engine keeps the others
    k = torch.randn(2, 2, 1, 8)
    keys, _ = layer.update(k, torch.randn(2, 2, 1, 8))
    assert torch.equal(keys, torch.cat([before[[0, 2]], k], 2))


def test_gqa_attention_under_a_mask_equals_transformers_sdpa():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(2)
    module = types.SimpleNamespace(num_key_value_groups=3, is_causal=True, training=False)
    q, k, v = torch.randn(4, 9, 2, 16), torch.randn(4, 3, 10, 16), torch.randn(4, 3, 10, 16)
    mask = torch.ones(4, 1, 2, 10, dtype=torch.bool)
    mask[:2, :, :, :3] = False  # left padding
    mask[1, :, :, 6] = False  # a jump-forward hole
    ours, _ = gqa_sdpa_attention(module, q, k, v, mask, scaling=0.25)
    theirs, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.25)
    assert ours.shape == theirs.shape == (4, 2, 9, 16)
    assert torch.allclose(ours, theirs, atol=1e-6)
