"""coati_relay.rollout: the one "mask through the first stop token", and joining rollouts."""
from __future__ import annotations

import torch

from coati_relay.rollout import Rollout, response_mask

T = torch.tensor


def test_response_mask_keeps_the_first_stop_token_and_cuts_after_it():
    ids = T([[5, 2, 7, 2], [5, 6, 7, 8], [9, 3, 2, 2]])
    assert response_mask(ids, [2]).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0]]
    assert response_mask(ids, [2, 3]).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]]
    assert response_mask(ids, []).all()
    lengths = T([4, 2, 1])
    assert response_mask(ids, [2], lengths).tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [1, 0, 0, 0]]
    assert response_mask(ids, [], lengths).sum(dim=1).tolist() == [4, 2, 1]


def test_concat_pads_prompts_left_and_responses_right():
    def one(p, r, version):
        n = 2
        return Rollout(prompt_ids=torch.full((n, p), 7), prompt_mask=torch.ones(n, p, dtype=torch.long),
                       response_ids=torch.full((n, r), 8), response_mask=torch.ones(n, r, dtype=torch.bool),
                       logprobs=torch.full((n, r), -1.0), response_lengths=torch.full((n,), r), group_size=2,
                       weight_version=version, rewards=torch.ones(n), info={"gt_answer": ["a"]})

    joined = Rollout.concat([one(2, 3, 4), one(3, 1, 3)], pad_token_id=0)
    assert joined.prompt_ids.tolist()[2:] == [[7, 7, 7]] * 2 and joined.prompt_ids.tolist()[0] == [0, 7, 7]
    assert joined.response_ids.tolist()[2] == [8, 0, 0] and joined.logprobs[2].tolist() == [-1.0, 0.0, 0.0]
    assert joined.weight_version == 3 and joined.info == {"gt_answer": ["a", "a"]} and joined.num_prompts == 2


def test_a_pickled_rollout_comes_back_equal_and_leaves_no_cyclic_garbage(cyclic_garbage):
    """Its tensors travel as numpy arrays (`coati_relay.exchange.wire`); torch's own pickling of a tensor defines a
    class per call, garbage that only a full collection frees, and kept a long run's memory up between them."""
    import pickle

    import numpy as np

    from coati_relay.exchange.wire import from_wire, to_wire

    n = 4
    r = Rollout(prompt_ids=torch.arange(12).view(n, 3), prompt_mask=torch.ones(n, 3, dtype=torch.long),
                response_ids=torch.arange(8).view(n, 2), response_mask=T([[1, 0]] * n).bool(),
                logprobs=torch.randn(n, 2).bfloat16(), response_lengths=torch.full((n,), 2), group_size=2,
                weight_version=5, rewards=torch.randn(n), info={"gt_answer": ["a", "b"]})
    back, garbage = cyclic_garbage(
        lambda: [pickle.loads(pickle.dumps(r, protocol=pickle.HIGHEST_PROTOCOL)) for _ in range(5)][-1])
    assert garbage == 0, f"{garbage} objects of cyclic garbage from 5 round trips"
    for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "logprobs", "response_lengths",
                 "rewards"):
        a, b = getattr(r, name), getattr(back, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert (back.group_size, back.weight_version, back.info, back.format_acc) == (2, 5, {"gt_answer": ["a", "b"]},
                                                                                   None)
    read_only = np.arange(3)
    read_only.flags.writeable = False  # as Ray's object store hands an array back
    t = from_wire(("int64", read_only))
    t += 1  # a copy: writable, and the stored array is untouched
    assert t.tolist() == [1, 2, 3] and read_only.tolist() == [0, 1, 2]
    assert from_wire(to_wire(torch.ones(2, dtype=torch.bfloat16))).dtype == torch.bfloat16
