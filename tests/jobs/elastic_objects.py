"""An ObjectState job: `write` commits 10, 20, 30; `read` prints what run() restored; `crash`
commits 10 and 20, then every rank dies halfway through writing commit 3."""

import os
import sys

import horovodlite.torch as hvd

from horovodlite.training import commit_store

mode = sys.argv[1]
hvd.init()
state = hvd.elastic.ObjectState(value=-1)
state.register_reset_callbacks([lambda: print(f"rank {hvd.rank()} reset", flush=True)])


def _die_halfway(self, number, payload):
    os.makedirs(self.folder, exist_ok=True)
    with open(f"{self.path(number)}.tmp-{os.getpid()}", "wb") as f:
        f.write(payload[: len(payload) // 2])
    os._exit(9)


@hvd.elastic.run
def train(state):
    print(f"rank {hvd.rank()} value {state.value} commit {state.commit_number}", flush=True)
    if mode == "read":
        return
    for value in (10, 20, 30):
        if mode == "crash" and value == 30:
            commit_store.CommitStore.write = _die_halfway
        state.value = value
        state.commit()


train(state)
print(f"rank {hvd.rank()} done", flush=True)
