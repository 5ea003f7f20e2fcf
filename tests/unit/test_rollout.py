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
