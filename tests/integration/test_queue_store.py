"""One suite over every ``QueueStore`` (storage/handles.py): the plain in-process
``TransferQueue`` the unit tests drive the buffers with, and ``QueueClient`` around the run's
queue actor. What the replay buffers and the group filter rely on must hold for both."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rl_train.storage.handles import QueueStore
from rl_train.storage.transfer_queue import TagTransitionError, TransferQueue

pytestmark = pytest.mark.integration


@pytest.fixture(params=["in_process", "ray_actor"])
def store(request: pytest.FixtureRequest) -> Iterator[QueueStore]:
    if request.param == "in_process":
        yield TransferQueue()
        return
    ray = request.getfixturevalue("ray_local")
    from rl_train.config import Config
    from rl_train.engines.workers.queue_client import QueueClient
    from rl_train.engines.workers.queue_worker import QueueWorker

    actor = ray.remote(QueueWorker).options(num_cpus=0).remote(Config.model_validate({}).model_dump(mode="json"))
    try:
        yield QueueClient(actor)
    finally:
        ray.kill(actor)


def _put_group(store: QueueStore) -> None:
    store.put("train", {"g": {"prompt": "1+1="}}, {"g": {"kind": "prompt", "status": "pending"}})
    store.put(
        "train",
        {f"g/{j}": {"group_id": "g", "response_ids": [1, 2, 3], "reward": float(j)} for j in range(2)},
        {f"g/{j}": {"kind": "trajectory", "group_id": "g"} for j in range(2)},
    )


def test_records_come_back_whole_or_as_the_chosen_fields(store: QueueStore) -> None:
    _put_group(store)
    store.put("train", {"g/1": {"is_infra": True}})  # merged into the record
    assert store.get("train", ["g/0"]) == [{"group_id": "g", "response_ids": [1, 2, 3], "reward": 0.0}]
    chosen = store.get("train", ["g/0", "g/1"], ["group_id"], ["reward", "is_infra"])
    assert chosen == [{"group_id": "g", "reward": 0.0}, {"group_id": "g", "reward": 1.0, "is_infra": True}]
    with pytest.raises(KeyError, match="lacks field"):
        store.get("train", ["g/0"], ["old_log_probs"])


def test_tags_follow_the_prompt_lifecycle_and_answer_queries(store: QueueStore) -> None:
    _put_group(store)
    assert store.query("train", kind="prompt", status="pending") == ["g"]
    assert store.query("train", group_id="g") == ["g/0", "g/1"]
    store.set_tags("train", {"g": {"status": "running"}})
    store.set_tags("train", {"g": {"status": "finished"}})
    assert [t["status"] for t in store.get_tags("train", ["g"])] == ["finished"]
    with pytest.raises(TagTransitionError):
        store.set_tags("train", {"g": {"status": "running"}})


def test_batches_carry_metadata_and_drop_with_their_records(store: QueueStore) -> None:
    _put_group(store)
    store.put_batch("b", "train", ["g/0", "g/1"], groups=["g"], step=3)
    assert store.get_batch("b", ["groups"]) == {"groups": ["g"]}
    assert store.get_batch("b")["step"] == 3
    store.delete("train", ["g"])
    store.drop_batch("b")
    assert store.query("train") == []
    with pytest.raises(KeyError, match="unknown batch"):
        store.get_batch("b")
