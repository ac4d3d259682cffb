"""The question before the hand-over: a suspect target track is asked about on its next
frame, ahead of the evidence rule and the budget, once (uq_autonomy.help.policy)."""

from __future__ import annotations

import itertools

from uq_autonomy.help.policy import (
    HelpPolicy,
    HelpPolicyConfig,
    TrackObservation,
    Trigger,
)


def policy(**kw: object) -> HelpPolicy:
    counter = itertools.count(1)
    base = dict(calibrated_score_threshold=0.95, window_frames=5, min_frames_above=4,
                cooldown_s=30.0, requests_per_minute=1, requests_per_hour=10)
    base.update(kw)
    return HelpPolicy(HelpPolicyConfig(**base), new_request_id=lambda: f'req-{next(counter)}')


def obs(track_id: int, score: float = 0.6, embedding: list[float] | None = None,
        box: tuple[float, float, float, float] = (50.0, 50.0, 20.0, 20.0)
        ) -> TrackObservation:
    return TrackObservation(track_id=track_id, class_index=4, class_name='ellipsoid',
                            box=box, embedding=embedding, calibrated_score=score)


def test_a_familiar_looking_suspect_target_is_asked_about_at_once():
    p = policy()
    assert p.observe(0.0, [obs(3)]) == []  # below the help threshold: no evidence of its own
    p.ask_before_hand_over(3)
    decisions = p.observe(0.1, [obs(3), obs(4)])
    assert [d.track_id for d in decisions] == [3]
    assert decisions[0].trigger is Trigger.SUSPECT_TARGET
    assert 'Is this the ellipsoid?' in decisions[0].reason
    assert 'suspect target before hand-over' in decisions[0].reason.lower()


def test_the_question_is_not_held_back_by_the_budget_and_asked_once():
    p = policy(calibrated_score_threshold=0.5, min_frames_above=1)
    far = (200.0, 150.0, 20.0, 20.0)  # another object: no IoU match with track 3
    assert len(p.observe(0.0, [obs(1, 0.9, box=far)])) == 1  # spends the budget
    p.ask_before_hand_over(3)
    assert [d.track_id for d in p.observe(0.1, [obs(3)])] == [3]
    p.ask_before_hand_over(3)  # the arbitration holds on: no second question
    assert p.observe(0.2, [obs(3)]) == []


def test_a_track_of_an_object_already_asked_about_is_not_asked_again():
    p = policy()
    p.ask_before_hand_over(3)
    assert len(p.observe(0.0, [obs(3, embedding=[1.0, 0.0])])) == 1
    # The track breaks and re-forms with a new id: the embedding matches the pending object.
    p.ask_before_hand_over(9)
    assert p.observe(1.0, [obs(9, embedding=[1.0, 0.01])]) == []


def test_the_mark_waits_for_the_track_and_ignores_untracked_ids():
    p = policy()
    p.ask_before_hand_over(-1)
    p.ask_before_hand_over(5)
    assert p.observe(0.0, [obs(4)]) == []
    assert [d.track_id for d in p.observe(0.1, [obs(5)])] == [5]
