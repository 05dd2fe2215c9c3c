"""Running the core's collectives as TensorFlow ops: eagerly, inside `tf.function`, in TF1 graphs.

Every op hands numpy arrays to the core and returns its result. Eagerly it runs at once, as a
blocking call of the core; in a graph it is a `tf.numpy_function` that runs when the graph does
and hands the arrays to the core's engine (in a TF1 graph, two: a submit and a wait, so that
waits never hold the threads submits need). Inside `tf.function` (and the graph `model.fit`
compiles) TensorFlow runs stateful ops in program order, so requests keep the engine's
submission-order names. In a TF1 graph, ops that do not depend on each other may run in any
order, so each op takes a name from its place in the graph (the same on every rank that built
the same graph) and the engine matches requests by it. mpi_ops.py builds each collective on
these.
"""

import contextlib
import itertools
import threading
import weakref

import numpy as np

import horovodlite as core
import tensorflow as tf
from horovodlite.process_sets import global_process_set

try:  # whether a tape or an accumulator records on this thread: TensorFlow's own test, 0.1 µs
    from tensorflow.python.eager.record import could_possibly_record as _recording
except ImportError:  # (a TensorFlow that moved it: always record, as before)

    def _recording() -> bool:
        return True


__all__ = [
    "differentiable",
    "request_name",
    "rows_shape",
    "run_local",
    "run_op",
    "set_size",
]


# An op that waits for the other ranks holds one of TensorFlow's inter-op threads while it waits.
# If the ranks' executors picked different ops to run first, every thread of a rank could be held
# by waits for requests that the other ranks have not submitted yet, because the ops that would
# submit them are queued behind those waits: a deadlock, however many threads there are, once
# the graph has enough collectives. So each collective is a submit, which hands the arrays to
# the engine and never blocks, and a wait; a wait may block only once this rank has submitted
# every request of the step that does not depend on its result. The engine matches requests by
# name in any order, so every request is then submitted on every rank and completes.
#
# - Eagerly nothing comes between the submit and the wait: the collective runs as a blocking
#   call (`_at_once`), without the engine's round trip.
# - Inside tf.function TensorFlow runs stateful ops in program order (automatic control
#   dependencies), the same on every rank, so one op submits and then waits. (A blocking call
#   there took 1.2 to 1.4x the engine's time for grouped all-reduces of 4.8 to 8 MB, a train
#   step's gradients, on a TensorFlow thread: docs/tensorflow.md.)
# - In a TF1 graph they are two ops, and every wait gets a control dependency on every submit of
#   the graph that does not depend on it and reads the same sources (placeholders, variables,
#   iterators: `_sources`), so fetching one collective never runs a collective that reads
#   other inputs (a broadcast of the variables is not re-run by every training step, and a
#   prediction does not need the labels the gradients need). A wait also completes the other
#   requests its run submitted, so that no run leaves one in flight (`_finish_submitted`).


def request_name(name, *, kind: str):
    """Return the engine's name for a request: the user's, submission order, or graph place."""
    if tf.executing_eagerly() or tf.inside_function():
        return name
    graph = tf.compat.v1.get_default_graph()
    if name is None:
        return graph.unique_name(f"horovodlite_{kind}", mark_as_used=True)
    return _unique_in_graph(graph, name)


_graph_names = weakref.WeakKeyDictionary()  # tf.Graph -> {request name: times given}


def _unique_in_graph(graph, name: str) -> str:
    """Return `name`, or `name_1`, `name_2`, ... if an earlier collective of `graph` took it.

    Horovod's ops take their graph node's name, so two collectives given one name in a TF1 graph
    are two requests; one run may submit both (see below), and the engine refuses a name in
    flight. The graph's op names are left alone: users fetch tensors by those.
    """
    taken = _graph_names.setdefault(graph, {})
    unique, count = name, taken.get(name, 0)
    while unique in taken:
        count += 1
        unique = f"{name}_{count}"
    taken[name] = count
    taken.setdefault(unique, 0)
    return unique


class _MismatchError(core.MismatchError, tf.errors.FailedPreconditionError):
    """Ranks disagree about a collective: horovodlite's MismatchError, and the
    tf.errors.FailedPreconditionError that Horovod's TensorFlow ops raise."""

    def __init__(self, message: str):
        tf.errors.FailedPreconditionError.__init__(self, None, None, message)

    def __reduce__(self):
        return type(self), (self.message,)


class _InvalidArgumentError(ValueError, tf.errors.InvalidArgumentError):
    """A bad argument of a collective run eagerly: horovodlite's ValueError, and the
    tf.errors.InvalidArgumentError that TensorFlow raises for it in a graph, as Horovod does."""

    def __init__(self, message: str):
        tf.errors.InvalidArgumentError.__init__(self, None, None, message)

    def __reduce__(self):
        return type(self), (self.message,)


def _at_once(start, arrays):
    """Return a finish that runs the collective `start` as a blocking call when called."""
    return lambda: start(*arrays, blocking=True)()


def _run_eagerly(start, arrays, touts: list) -> list:
    """Run the collective `start` now; raise its errors with TensorFlow's classes."""
    try:
        return _finishing(_at_once(start, arrays), touts)()
    except (_MismatchError, _InvalidArgumentError):
        raise
    except ValueError as error:
        raise _InvalidArgumentError(str(error)) from error


def _finishing(finish, touts: list):
    """Return a function that waits for `finish()` and returns its results as `touts`."""

    def wait():
        try:
            outs = finish()
        except _MismatchError:
            raise
        except core.MismatchError as error:
            raise _MismatchError(str(error)) from error
        return [np.asarray(o, dtype=d.as_numpy_dtype) for o, d in zip(outs, touts)]

    return wait


# A Python exception inside a graph's numpy_function reaches the caller as tf.errors.UnknownError
# (InvalidArgumentError for ValueError and TypeError): TensorFlow keeps its message, not its
# class. Horovod's ops raise FailedPreconditionError when the ranks disagree, and Horovod's users
# catch that. No TensorFlow op raises a chosen error class with a chosen message, but reading a
# file below /dev/null fails with FailedPreconditionError ("Not a directory") quoting the path.
# So in a graph the wait returns a disagreement as text instead of raising, and one ReadFile op
# reads "/dev/null" + that text: an empty read of /dev/null when the ranks agreed, the error with
# its message when not. The path stays under Linux's PATH_MAX (longer ones fail differently).
_AGREED = "/dev/null"
_LONGEST_MESSAGE = 3000


def _finishing_in_graph(finish, touts: list):
    """Return the wait of `finish()` for a graph: its results and the mismatch text ("")."""
    wait = _finishing(finish, touts)

    def wait_in_graph():
        try:
            return [*wait(), np.bytes_(b"")]
        except _MismatchError as error:
            message = str(error)[:_LONGEST_MESSAGE]
            empty = [np.zeros(0, d.as_numpy_dtype) for d in touts]
            return [*empty, np.bytes_(f"/\n{message}\n".encode())]

    return wait_in_graph


def _raising_mismatch(outs: list, mismatch) -> list:
    """Return `outs`, made to depend on the read that raises for a `mismatch` text."""
    agreed = tf.strings.length(tf.io.read_file(tf.strings.join([_AGREED, mismatch])))  # 0
    # A data dependency: grappler drops control dependencies on stateless ops such as ReadFile.
    return [tf.reshape(out, tf.shape(out) + agreed) for out in outs]


def run_op(start, inputs: list, *, touts: list, shapes: list, kind: str) -> list:
    """Return the tensors that the collective `start(*arrays, blocking=...)` computes, eagerly
    or in a graph.

    `start` returns `finish`, which returns the results. With `blocking=True` (eagerly) it runs
    the collective at once; with False (in a graph) it submits it to the engine without
    blocking, and `finish` waits for the other ranks (see above for how they are ordered).
    """
    inputs = [tf.convert_to_tensor(t) for t in inputs]
    if tf.executing_eagerly():
        outs = _run_eagerly(start, [t.numpy() for t in inputs], touts)
        return [tf.convert_to_tensor(o, dtype=d) for o, d in zip(outs, touts)]
    if tf.inside_function():
        *outs, mismatch = tf.numpy_function(
            lambda *arrays: _finishing_in_graph(start(*arrays, blocking=False), touts)(),
            inputs,
            [*touts, tf.string],
            stateful=True,
            name=f"Horovodlite{kind}",
        )
        outs = _raising_mismatch(outs, mismatch)
    else:
        outs = _submit_then_wait(start, inputs, touts=touts, kind=kind)
    for out, shape in zip(outs, shapes):
        out.set_shape(shape)
    return list(outs)


def run_local(func, *, touts: list, kind: str) -> list:
    """Return ops that give `func()` when run: no other rank takes part."""
    if tf.executing_eagerly():
        return [tf.convert_to_tensor(o, dtype=d) for o, d in zip(func(), touts)]
    return list(tf.numpy_function(func, [], touts, stateful=True, name=f"Horovodlite{kind}"))


# A TF1 graph's submit op hands its wait op a ticket; the submitted request is kept here meanwhile.
_tickets: dict = {}
_ticket_lock = threading.Lock()
_ticket_numbers = itertools.count(1)


class _Request:
    """A TF1 graph's submitted collective: its wait, run once by whichever op needs it first."""

    def __init__(self, finish):
        self._finish, self._lock, self._outcome = finish, threading.Lock(), None

    def result(self) -> list:
        """Wait for the collective (the first call only); return its results or raise its error."""
        with self._lock:
            if self._outcome is None:
                try:
                    self._outcome = (self._finish(), None)
                except Exception as error:
                    self._outcome = (None, error)
        results, error = self._outcome
        if error is not None:
            raise error
        return results

    def complete(self) -> None:
        """Wait for the collective; keep its results, or its error, for its own wait op."""
        with contextlib.suppress(Exception):
            self.result()


class _Collective:
    """A TF1 graph's collective: its submit and wait ops, the sources it reads, the collectives
    whose submits its wait runs after, and the ticket of its latest request."""

    def __init__(self):
        self.submit = self.wait = self.sources = None
        self.after: list = []  # [_Collective]: their submits are control inputs of this wait
        self.ticket = None


_graph_collectives = weakref.WeakKeyDictionary()  # tf.Graph -> [_Collective]


def _submit_then_wait(start, inputs: list, *, touts: list, kind: str) -> list:
    """Return the outputs of a TF1 graph's wait op for the collective `start`, after its submit."""
    collective = _Collective()

    def submit(*arrays):
        with _ticket_lock:
            unfinished = _tickets.pop(collective.ticket, None)
        if unfinished is not None:
            # Waits finish every request their run submitted (below), unless the run failed
            # first: every rank submitted it, so it completes; let it, so its name is free.
            unfinished.complete()
        request = _Request(_finishing_in_graph(start(*arrays, blocking=False), touts))
        with _ticket_lock:
            collective.ticket = next(_ticket_numbers)
            _tickets[collective.ticket] = request
        return np.int64(collective.ticket)

    def wait(ticket):
        with _ticket_lock:
            request = _tickets.pop(int(ticket))
        try:
            return request.result()
        finally:
            _finish_submitted(collective.after)

    token = tf.numpy_function(
        submit, inputs, tf.int64, stateful=True, name=f"Horovodlite{kind}Submit"
    )
    *outs, mismatch = tf.numpy_function(
        wait, [token], [*touts, tf.string], stateful=True, name=f"Horovodlite{kind}"
    )
    collective.submit, collective.wait = token.op, mismatch.op
    _order(collective)
    return _raising_mismatch(outs, mismatch)


def _finish_submitted(collectives: list) -> None:
    """Wait for the latest request of each of `collectives` that its own wait has not taken.

    A run that fetches one collective runs the submits of the others that its wait runs after
    (`_order`), perhaps without their waits. Their requests must not outlive the run: a later
    request of the same name (another graph, eager code) would find one in flight. Every rank
    submitted them before this wait, so they complete; a wait that the run does include takes the
    kept result. What it costs: the fetched collective's consumers start only when every
    collective that its run submitted has completed.
    """
    with _ticket_lock:
        requests = [_tickets.get(c.ticket) for c in collectives]
    for request in requests:
        if request is not None:
            request.complete()


def _ancestors(op) -> set:
    """Return every op that `op` depends on, through data and control inputs."""
    seen, todo = set(), [op]
    while todo:
        current = todo.pop()
        for parent in [t.op for t in current.inputs] + list(current.control_inputs):
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
    return seen


def _sources(ancestors: set, ours: set) -> frozenset:
    """Return the ops among `ancestors` whose values come from outside the graph's computation.

    Those are the placeholders (fed), and the stateful ops without inputs: variables, iterators,
    queues, readers, the user's own stateful Python ops.
    """
    return frozenset(
        op
        for op in ancestors
        if op.type.startswith("Placeholder")
        or (not op.inputs and op.op_def.is_stateful and op not in ours)
    )


def _order(collective: _Collective) -> None:
    """Make every wait of the graph run after every submit that it does not feed (same sources)."""
    submit, wait = collective.submit, collective.wait
    collectives = _graph_collectives.setdefault(submit.graph, [])
    ours = {op for c in collectives for op in (c.submit, c.wait)} | {submit, wait}
    ancestors = _ancestors(submit)
    collective.sources = _sources(ancestors, ours)
    for other in collectives:
        if other.sources != collective.sources:
            continue
        # Operation._add_control_input is TensorFlow's own way to add a control input to an op
        # that exists (tf.control_dependencies only reaches ops created inside it). Neither edge
        # can close a cycle: the new wait feeds nothing yet, and `other.wait` gets this submit
        # only if it does not feed it.
        wait._add_control_input(other.submit)
        collective.after.append(other)
        if other.wait not in ancestors:
            other.wait._add_control_input(submit)
            other.after.append(collective)
    collectives.append(collective)


def differentiable(forward, backward, tensors: list) -> list:
    """Return `forward(tensors)`, with `backward(upstream, tensors)` as its gradient.

    Eagerly, with no GradientTape (or ForwardAccumulator) recording on this thread, no gradient
    can be asked for: the op runs without `tf.custom_gradient`, which costs more per call than
    the collective itself (docs/tensorflow.md).
    """
    if not all(t.dtype.is_floating or t.dtype.is_complex for t in tensors):
        return forward(tensors)
    if tf.executing_eagerly() and not _recording():
        return forward(tensors)

    @tf.custom_gradient
    def op(*xs):
        ys = forward(list(xs))

        def grad(*dys):
            dys = [tf.zeros_like(y) if d is None else d for d, y in zip(dys, ys)]
            return backward(dys, list(xs))

        return ys, grad

    return list(op(*tensors))


def rows_shape(tensor) -> tf.TensorShape:
    """Return the static shape of a result whose dimension 0 is known only at run time."""
    shape = tensor.shape
    return tf.TensorShape([None]) + shape[1:] if shape.rank else tf.TensorShape(None)


def set_size(process_set) -> int:
    return (process_set or global_process_set).size()
