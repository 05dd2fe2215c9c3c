"""Asynchronous training with sharded parameter servers: the torch glue (see docs/ps.md).

The last `servers` ranks hold the model's parameters, cut into row ranges over them
(horovodlite.training.ps.layout), and each runs the user's torch.optim optimizer on its shard as
gradients arrive; the other ranks train. The messages, the consistency rule and the fault
handling are framework free (horovodlite.training.ps); this module turns parameters into
arrays and back, runs the optimizer, and hooks the model so that its forward pulls what it
needs:

    job = hvd.ps.start(model, functools.partial(torch.optim.SGD, lr=0.1), servers=1)
    if job.is_server:
        job.serve()
    else:
        for x, y in batches:
            loss_fn(model(x), y).backward()  # the forward waits for the current parameters
            job.push()  # sends the gradients, asks for the next step's parameters
        job.finish()  # the final parameters are in `model`

With `checkpoint_every=k` each server writes its shard and its optimizer's state every k
updates, and a job started again (by hand, or by `horovodlite-run`'s elastic mode after a
server died) resumes from the servers' last common checkpoint; `job.step` then says how many of
its steps a worker had taken.
"""

import atexit
import hashlib
import inspect
import io
import logging
import os
import sys

import numpy as np

import torch
from horovodlite.training.ps import checkpoint, layout, startup
from horovodlite.training.ps.server import ServerLoop
from horovodlite.training.ps.stats import job_report
from horovodlite.training.ps.waits import Peer
from horovodlite.training.ps.worker import WorkerClient

__all__ = ["start", "Server", "Worker"]

_log = logging.getLogger("horovodlite.ps")
_FLOATS = (torch.float16, torch.float32, torch.float64)


def start(model: torch.nn.Module, optimizer, servers: int = 1, staleness=None,
          sparse_optimizer=None, timeout=None, silence: float = 60.0, checkpoint_every=None,
          checkpoint_dir=None):  # fmt: skip
    """Start the parameter servers of `model`, on every rank; return this rank's Server or Worker.

    Every rank builds the same model and calls start() with the same arguments.

    Args:
        model: the model; its parameters must be equal on every rank (seed alike).
        optimizer: a function of a list of parameters returning a torch.optim optimizer, e.g.
            `functools.partial(torch.optim.Adam, lr=1e-3)`; each server builds one on its shard.
        servers: how many ranks (the last ones) serve; the others train.
        staleness: None for fully asynchronous training; s >= 1 lets a worker run at most s steps
            ahead of the slowest; 0 is synchronous training (the mean of every worker's gradient,
            one update per step), equal to data-parallel all-reduce training.
        sparse_optimizer: the same for the rows of `nn.Embedding(sparse=True)` layers (default:
            `optimizer`); it must accept sparse gradients (SGD, Adagrad, SparseAdam).
        timeout: seconds a worker waits for a server (default HOROVODLITE_COLLECTIVE_TIMEOUT).
        silence: seconds without a message after which a worker on another host counts as
            dead (on the same host a worker is dead when its process is gone).
        checkpoint_every: each server writes a checkpoint of its shard and optimizer state every
            this many updates (and at the end); None: no checkpoints. A job that finds
            checkpoints resumes from the newest one every server holds.
        checkpoint_dir: where (a folder every server can write); default under horovodlite-run's
            elastic mode: the elastic job's folder (HOROVODLITE_ELASTIC_DIR/job id).

    Raises:
        TypeError, ValueError: on every rank, before training: a bad server count or staleness,
            an optimizer that cannot run on a shard (LBFGS), parameters that differ on the ranks,
            checkpoints written for another model or server count.
    """
    context = startup.open_job()
    comm = context.comm
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    sparse_names = _sparse_embeddings(model)
    error = None
    root = None
    try:
        startup.check_settings(comm.size, servers, staleness)
        root = checkpoint.checkpoint_root(checkpoint_every, checkpoint_dir, context.elastic_dir,
                                          context.elastic_job_id)  # fmt: skip
        _check_parameters(named)
        _check_optimizer(optimizer, named[0][1].dtype, "optimizer", sparse=False)
        if sparse_names:
            _check_optimizer(sparse_optimizer or optimizer, named[0][1].dtype,
                             "sparse_optimizer", sparse=True)  # fmt: skip
    except Exception as e:  # any mistake travels to every rank, then raises everywhere
        error = e
    facts = (
        repr((servers, staleness)),
        [_digest(p) for _, p in named],
        startup.host_facts(os.getpid()),
    )
    try:
        shared = startup.agree(comm, error, facts)
        if any(f[0] != shared[0][0] for f in shared):
            raise ValueError(f"(servers, staleness) differ between ranks: {[f[0] for f in shared]}")
        startup.check_same_parameters([f[1] for f in shared], [n for n, _ in named])
    except (TypeError, ValueError, RuntimeError):
        comm.Free()
        raise
    me = startup.host_facts(os.getpid())[0]
    peers = {r: Peer(r, host, pid, host == me) for r, (_, _, (host, pid)) in enumerate(shared)}
    server_ranks, worker_ranks = startup.roles(comm.size, servers)
    params = [p for _, p in named]
    is_sparse = [n in sparse_names for n, _ in named]
    shards = layout.plan_shards([tuple(p.shape) for p in params], is_sparse, servers)
    files, (version, steps) = None, (None, {})
    if root is not None:
        files, (version, steps) = _find_checkpoint(comm, root, checkpoint_every, shards,
                                                   server_ranks)  # fmt: skip
    if comm.rank in server_ranks:
        shard = shards[server_ranks.index(comm.rank)]
        job = Server(comm, shard, params, optimizer, sparse_optimizer or optimizer,
                     worker_ranks, peers, staleness, silence, files, version, steps)  # fmt: skip
    else:
        timeout = context.timeout if timeout is None else timeout
        job = Worker(comm, model, params, shards, server_ranks, peers, sparse_names, named,
                     timeout, root is not None)  # fmt: skip
        # Synchronous steps are the servers' updates; otherwise each worker's own.
        job.client.step = (version or 0) if staleness == 0 else steps.get(comm.rank, 0)
    job.resumed_from = version
    if version is not None and comm.rank == 0:
        _log.warning("hvd.ps: resumed from the servers' checkpoint of update %d (in %s)",
                     version, root)  # fmt: skip
    return job


def _find_checkpoint(comm, root: str, every: int, shards: list, server_ranks: list) -> tuple:
    """Every rank: return (this server's ServerCheckpoints or None, (version, steps)).

    Each server offers the checkpoints it holds intact; all ranks pick the newest common one.
    """
    files, error, offer = None, None, None
    if comm.rank in server_ranks:
        index = server_ranks.index(comm.rank)
        shape = (len(server_ranks), [tuple(piece) for piece in shards[index]])
        files = checkpoint.ServerCheckpoints(root, index, every, shape)
        try:
            offer = files.intact()
        except (ValueError, OSError) as e:
            error = e
    try:
        offers = startup.agree(comm, error, offer)
    except (ValueError, RuntimeError):
        comm.Free()
        raise
    return files, checkpoint.choose_resume([offers[r] for r in server_ranks])


class Server:
    """A parameter server: holds its pieces of the parameters and updates them."""

    is_server = True

    def __init__(self, comm, shard, params, optimizer, sparse_optimizer, workers, peers,
                 staleness, silence, files=None, version=None, steps=None):  # fmt: skip
        self.shard = shard
        self.pieces = [torch.nn.Parameter(_rows(params[s.index], s).detach().clone())
                       for s in shard]  # fmt: skip
        dense = [p for p, s in zip(self.pieces, shard) if not s.sparse]
        sparse = [p for p, s in zip(self.pieces, shard) if s.sparse]
        self.optimizers = ([optimizer(dense)] if dense else []) + (
            [sparse_optimizer(sparse)] if sparse else []
        )
        if version is not None:
            self._restore(files.read(version)["state"])
            files.drop_newer(version)
        resume = (version or 0, steps or {})
        self.loop = ServerLoop(comm, workers, peers, self, staleness, silence, files, resume)
        self.report = None

    def serve(self) -> dict:
        """Serve until every worker has finished or died; return this server's summary."""
        self.report = self.loop.serve()
        _log.info("parameter server rank %d: %s", self.report["rank"], self.report)
        if self.report["dead_workers"]:
            _end_without_finalize()
        return self.report

    # -- the store the loop calls -------------------------------------------------------------

    def dense(self) -> list:
        return [p.detach().numpy().copy() for p, s in zip(self.pieces, self.shard) if not s.sparse]

    def rows(self, index: int, rows: np.ndarray) -> np.ndarray:
        piece, s = self._sparse_piece(index)
        return piece.detach().numpy()[rows - s.start]

    def sparse(self) -> dict:
        return {
            s.index: p.detach().numpy().copy() for p, s in zip(self.pieces, self.shard) if s.sparse
        }

    def apply(self, dense: list, sparse: dict) -> None:
        grads = iter(dense)
        for piece, s in zip(self.pieces, self.shard):
            if not s.sparse:
                piece.grad = torch.from_numpy(np.asarray(next(grads))).view_as(piece)
            elif s.index in sparse and len(sparse[s.index][0]):
                rows, values = sparse[s.index]
                local = torch.from_numpy(np.asarray(rows) - s.start)[None]
                piece.grad = torch.sparse_coo_tensor(
                    local, torch.from_numpy(values), piece.shape, check_invariants=True
                )
            else:
                piece.grad = None
        for opt in self.optimizers:
            opt.step()
        for piece in self.pieces:
            piece.grad = None

    def state(self) -> bytes:
        buffer = io.BytesIO()
        pieces = [p.detach() for p in self.pieces]
        torch.save({"pieces": pieces, "optimizers": [o.state_dict() for o in self.optimizers]},
                   buffer)  # fmt: skip
        return buffer.getvalue()

    def _restore(self, state: bytes) -> None:
        saved = torch.load(io.BytesIO(state), weights_only=True)
        with torch.no_grad():
            for piece, value in zip(self.pieces, saved["pieces"]):
                piece.copy_(value)
        for opt, opt_state in zip(self.optimizers, saved["optimizers"]):
            opt.load_state_dict(opt_state)

    def _sparse_piece(self, index: int):
        return next((p, s) for p, s in zip(self.pieces, self.shard) if s.index == index)


class Worker:
    """A worker: its model's forward pulls parameters; push() sends gradients."""

    is_server = False

    def __init__(self, comm, model, params, shards, server_ranks, peers, sparse_names, named,
                 timeout, resumable=False):  # fmt: skip
        self.params, self.shards = params, shards
        index_of = {n: i for i, (n, _) in enumerate(named)}
        bounds = {}
        for i in {s.index for shard in shards for s in shard if s.sparse}:
            pieces = [next(s for s in shard if s.index == i) for shard in shards]
            bounds[i] = [pieces[0].start] + [s.stop for s in pieces]
        self.client = WorkerClient(comm, server_ranks, peers, bounds, timeout, resumable)
        self._pulled = self._asked = False
        self._touched: dict = {}  # embedding index -> rows fetched this step
        self._hooks = [model.register_forward_pre_hook(lambda m, args: self.pull())]
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Embedding) and f"{name}.weight".lstrip(".") in index_of:
                i = index_of[f"{name}.weight".lstrip(".")]
                if i in bounds:
                    self._hooks.append(module.register_forward_pre_hook(self._row_hook(i)))
        self.report = None

    @property
    def step(self) -> int:
        """The steps this worker has pushed (after a resume: counted from the job's start)."""
        return self.client.step

    def pull(self) -> None:
        """Wait for the parameters of this step (asked for at the last push) and load them."""
        if self._pulled:
            return
        if not self._asked:
            self.client.request_params()
        with torch.no_grad():
            for shard, arrays in zip(self.shards, self.client.receive_params()):
                dense = [s for s in shard if not s.sparse]
                for s, array in zip(dense, arrays):
                    _rows(self.params[s.index], s).copy_(torch.from_numpy(array))
        self._pulled, self._asked = True, False

    def push(self) -> None:
        """Send this step's gradients to the servers and ask for the next step's parameters."""
        self.pull()  # a push without a forward still belongs to a step
        dense = [[] for _ in self.shards]
        sparse = [{} for _ in self.shards]
        for k, shard in enumerate(self.shards):
            for s in shard:
                if not s.sparse:
                    dense[k].append(_rows(_grad(self.params[s.index]), s).detach().numpy())
        for i, rows in self._touched.items():
            values = _row_grads(self.params[i], rows)
            for k, part in enumerate(self.client.split_rows(i, *values)):
                sparse[k][i] = part
        for p in self.params:
            p.grad = None  # the arrays sent are these buffers: backward must not reuse them
        self.client.push(dense, sparse)
        self.client.request_params()
        self._pulled, self._asked, self._touched = False, True, {}

    def finish(self) -> dict:
        """End training: load the final parameters into the model; return the servers' report."""
        if self._asked:
            self.client.receive_params()  # the answer to the last push's request
        finals = self.client.finish()
        for hook in self._hooks:
            hook.remove()
        with torch.no_grad():
            for shard, (_, dense, sparse, _, _) in zip(self.shards, finals):
                for s, array in zip([s for s in shard if not s.sparse], dense):
                    _rows(self.params[s.index], s).copy_(torch.from_numpy(array))
                for s in [s for s in shard if s.sparse]:
                    self.params[s.index][s.start : s.stop].copy_(torch.from_numpy(sparse[s.index]))
        self.report = job_report([f[3] for f in finals])
        self.report["worker"] = {"steps": self.client.step, "bytes_sent": self.client.bytes_sent,
                                 "bytes_received": self.client.bytes_received}  # fmt: skip
        if any(f[4] for f in finals):
            _end_without_finalize()
        return self.report

    def _row_hook(self, index: int):
        def fetch(module, args):
            rows = np.unique(args[0].detach().cpu().numpy().astype(np.int64, copy=False))
            seen = self._touched.get(index)
            new = rows if seen is None else np.setdiff1d(rows, seen, assume_unique=True)
            if len(new):
                values = self.client.rows(index, new)
                with torch.no_grad():
                    module.weight[torch.from_numpy(new)] = torch.from_numpy(values)
                self._touched[index] = new if seen is None else np.union1d(seen, new)

        return fetch


# -- helpers ----------------------------------------------------------------------------------


def _rows(tensor: torch.Tensor, piece) -> torch.Tensor:
    """The rows of `tensor` that `piece` names (a scalar parameter is one whole piece)."""
    return tensor if tensor.dim() == 0 else tensor[piece.start : piece.stop]


def _grad(param: torch.Tensor) -> torch.Tensor:
    """The gradient of a dense parameter; zeros when the forward did not use it."""
    return param.grad if param.grad is not None else torch.zeros_like(param)


def _row_grads(weight: torch.Tensor, rows: np.ndarray) -> tuple:
    """Return (rows, values) of an embedding's gradient on the rows fetched this step."""
    grad = weight.grad
    if grad is None:
        return rows[:0], np.zeros((0,) + tuple(weight.shape[1:]), _numpy_dtype(weight))
    if grad.is_sparse:
        grad = grad.coalesce()
        return grad.indices()[0].numpy(), grad.values().numpy()
    return rows, grad[torch.from_numpy(rows)].numpy()


def _numpy_dtype(tensor: torch.Tensor):
    return torch.empty(0, dtype=tensor.dtype).numpy().dtype


def _sparse_embeddings(model: torch.nn.Module) -> set:
    """Names of the weights of nn.Embedding(sparse=True) layers: served by rows."""
    return {f"{n}.weight".lstrip(".") for n, m in model.named_modules()
            if isinstance(m, torch.nn.Embedding) and m.sparse}  # fmt: skip


def _digest(param: torch.Tensor) -> str:
    return hashlib.blake2b(param.detach().cpu().numpy().tobytes(), digest_size=16).hexdigest()


def _check_parameters(named: list) -> None:
    if not named:
        raise ValueError("the model has no trainable parameter: nothing to serve")
    for name, p in named:
        if p.dtype not in _FLOATS or p.device.type != "cpu":
            raise TypeError(
                f"parameter '{name}' is {p.dtype} on {p.device}: parameter servers train float16, "
                "float32 or float64 parameters on the CPU"
            )


def _check_optimizer(factory, dtype, argument: str, sparse: bool) -> None:
    """Build `factory`'s optimizer on a probe parameter and take one step, as a server will."""
    if not callable(factory):
        raise TypeError(
            f"{argument} must be a function of a parameter list (e.g. "
            f"functools.partial(torch.optim.SGD, lr=0.1)), got {factory!r}"
        )
    probe = torch.nn.Parameter(torch.zeros(3, 2, dtype=dtype))
    opt = factory([probe])
    if not isinstance(opt, torch.optim.Optimizer):
        raise TypeError(f"{argument} must return a torch.optim.Optimizer, got {type(opt).__name__}")
    closure = inspect.signature(type(opt).step).parameters.get("closure")
    if closure is not None and closure.default is inspect.Parameter.empty:
        raise ValueError(
            f"{type(opt).__name__} needs a closure that re-evaluates the loss of the whole model "
            "at every step, which a server holding one shard cannot run: choose an optimizer "
            "that steps on gradients alone (SGD, Adam, AdamW, Adagrad, RMSprop, ...)"
        )
    if sparse:
        index = torch.tensor([[1]])
        probe.grad = torch.sparse_coo_tensor(
            index, torch.zeros(1, 2, dtype=dtype), (3, 2), check_invariants=True
        )
        try:
            opt.step()
        except RuntimeError as e:
            raise ValueError(
                f"{type(opt).__name__} cannot update the rows of nn.Embedding(sparse=True) "
                f"layers ({str(e).splitlines()[0]}): pass sparse_optimizer= an optimizer of "
                "sparse gradients (torch.optim.SGD, Adagrad or SparseAdam)"
            ) from None


def _end_without_finalize() -> None:
    """A rank of the job died: MPI_Finalize would wait for it forever, so exit without it.

    Runs at interpreter exit, before mpi4py finalizes MPI (atexit runs the last registered
    first), once the output is flushed.
    """

    def leave():
        failed = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1 if failed is not None else 0)

    atexit.register(leave)
