"""The torch backend: torch tensors over torch.distributed.

Rank and size come from ``torchrun``'s environment (RANK, WORLD_SIZE, LOCAL_RANK) or, when the
script was started by ``mpiexec``, from MPI (rank 0 then picks a free port for the rendezvous
and announces it with MPI's broadcast).

Which engine carries the bytes:

* ``device="cpu"``: gloo.
* ``device="cuda"`` and every rank on a host has its own GPU: NCCL, tensors stay on the GPU.
* ``device="cuda"`` and ranks must share a GPU (e.g. 4 ranks, 1 GPU): NCCL refuses two ranks
  on one device, so compute stays on the GPU and communication goes through gloo with host
  staging: each send copies the tensor to the CPU, each recv lands in a CPU buffer and is
  copied back to the GPU. Correct, but the copies cost bandwidth: benchmark numbers in this
  mode measure PCIe + gloo, not NVLink.

``Request.test()`` asks torch's ``Work.is_completed()``. gloo's point-to-point work objects
report completion only once ``wait()`` has run, so on gloo ``test()`` stays False until then:
overlap there comes from the engine's own threads, not from polling.
"""
from __future__ import annotations

import gc
import inspect
import os
import socket
import sys
import threading
import types
import weakref

import torch
import torch.distributed as dist

from .base import Comm
from ..errors import UsageError
from ..xp import chunk_bounds

_OPS = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT,
        "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


def torch_op(op):
    try:
        return _OPS[op]
    except KeyError:
        raise ValueError(f"op={op!r}: choose one of {sorted(_OPS)}") from None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rendezvous():
    """(rank, size, local_rank) for this process, setting MASTER_ADDR/PORT when needed."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    from mpi4py import MPI  # started by mpiexec (or plain python: a world of one)

    world = MPI.COMM_WORLD
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        os.environ["MASTER_PORT"] = str(world.bcast(_free_port() if world.rank == 0 else None, 0))
    local = world.Split_type(MPI.COMM_TYPE_SHARED)
    return world.rank, world.size, local.rank


# torch >= 2.13: new_group(..., sort_ranks=False) keeps the caller's order (group rank = position in
# the list); before it, a group's ranks are always in the world's order
_KEEPS_ORDER = "sort_ranks" in inspect.signature(dist.new_group).parameters


def require_gpu():
    """``torch.cuda`` where torch sees a CUDA device, else a UsageError: what ``launch`` asks
    before any rank starts with device='cuda', and each rank again."""
    if not torch.cuda.is_available():
        raise UsageError("device='cuda': torch sees no CUDA device on this machine (the cpu device runs everywhere)")
    return torch.cuda


def choose_engine(device: str, local_size: int) -> tuple[str, str | None]:
    """(engine, why): the engine for ``device`` with ``local_size`` ranks on this host, and a
    line saying why when it is not the one asked for (rank 0 prints it, once per job)."""
    if device == "cpu":
        return "gloo", None
    gpus = require_gpu().device_count()
    if gpus >= local_size:
        return "nccl", None
    return "gloo", (f"device='cuda' with {local_size} ranks on {gpus} GPU{'s' if gpus > 1 else ''} on this host: "
                    f"NCCL needs a GPU per rank, so the ranks compute on the GPU and communicate through "
                    f"gloo with host staging (measured bandwidth is then PCIe + gloo, not NCCL)")


def destroy_groups():
    """Destroy every process group *now*, joining gloo's threads while Python is fully alive.

    gloo runs collectives on worker threads, and the thread that drops a finished work frees
    its tensors; freeing a tensor whose Python object has died takes the GIL. A gloo thread
    still waiting for the GIL when Python starts shutting down is ended by CPython
    (``pthread_exit``) inside that C++ destructor: ``std::terminate``, "terminate called
    without an active exception" (docs/faults.md: the backtrace and a reproducer). A destroyed
    group has joined its threads, but ``destroy_process_group`` destroys only groups nothing
    else references, and some always are: by our communicators (dropped here), by torch
    modules imported after ``init_process_group``, which capture the world group as a default
    argument (``def broadcast(tensor, src, group=group.WORLD)`` in torch.distributed.nn.functional,
    ZeroRedundancyOptimizer, FSDP's ShardedGradScaler: pointed back at None, torch's own "the
    default group"), and by DeviceMeshes that DTensor's caches keep (FSDP2: the meshes forget
    their groups). A group still referenced after all that is reported.
    """
    if not dist.is_initialized():
        return
    groups = list(dist.distributed_c10d._world.pg_map)  # every group, torch's own included
    for comm in list(_COMMS):
        comm.group = comm.builtin.group = None  # any later use fails: no default group
    _forget_captured(groups)
    if "torch.distributed.tensor" in sys.modules:  # DTensor in use: its caches hold meshes
        from torch.distributed.device_mesh import DeviceMesh

        for mesh in [o for o in gc.get_objects() if type(o) is DeviceMesh]:
            mesh._pg_registry.clear()
    gc.collect()  # finished Work objects and their tensors go while Python is alive
    dist.destroy_process_group()
    held = [g for g in groups if sys.getrefcount(g) > 3]  # ours: the list, g, the call's argument
    if held:
        sys.stderr.write(f"minipar: {len(held)} process group(s) still referenced after finalize(); "
                         f"gloo's threads outlive them and can abort the process at exit\n")
    groups.clear()  # the last reference: each group is destroyed here and joins its threads


def _forget_captured(groups):
    """Default arguments of torch.distributed's functions that hold one of ``groups`` -> None."""
    held = {id(g) for g in groups}
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith("torch.distributed"):
            continue
        for obj in list(vars(module).values()):  # type(), not isinstance: no deprecation warnings
            for fn in (obj, *(vars(obj).values() if issubclass(type(obj), type) else ())):
                if type(fn) in (staticmethod, classmethod):
                    fn = fn.__func__
                if type(fn) is not types.FunctionType:
                    continue
                if fn.__defaults__ and any(id(v) in held for v in fn.__defaults__):
                    fn.__defaults__ = tuple(None if id(v) in held else v for v in fn.__defaults__)
                for k, v in (fn.__kwdefaults__ or {}).items():
                    if id(v) in held:
                        fn.__kwdefaults__[k] = None


_COMMS = weakref.WeakSet()  # every TorchComm, so that destroy_groups can drop their groups


class ToSelf:
    """Messages a rank sends to itself. gloo pairs only distinct ranks, so a message to oneself
    never reaches the engine; MPI delivers it as a copy, and so does this, with MPI's rules: a
    send (synchronous, like ``MPI_Ssend``) completes only against a receive already posted with
    ``irecv``, a receive only against an ``isend`` already posted; otherwise the call blocks for
    good and the watchdog reports it, as it would under MPI (a ring of one rank that sends before
    it receives deadlocks on both backends). Matching is by tag, in posting order."""

    def __init__(self):
        self.sends, self.recvs = [], []  # pending (tag, tensor, done flag) of each kind

    @staticmethod
    def _deliver(x, buf):
        if tuple(x.shape) != tuple(buf.shape) or x.dtype != buf.dtype:
            raise ValueError(f"a message to oneself of shape {tuple(x.shape)} {x.dtype} into buf "
                             f"{tuple(buf.shape)} {buf.dtype}")
        buf.copy_(x)

    def _match(self, queue, tag):
        for i, (t, tensor, flag) in enumerate(queue):
            if t == tag:
                del queue[i]
                return tensor, flag
        return None, None

    @staticmethod
    def _never():
        threading.Event().wait()  # nothing can complete it: the watchdog reports the deadlock

    def post(self, x, tag, blocking):
        """A send of ``x`` to oneself: (wait, test) of a posted ``isend``, or done when blocking."""
        return self._meet(self.recvs, self.sends, tag, blocking, x.clone(), lambda buf: (x, buf))

    def take(self, buf, tag, blocking):
        """A receive from oneself into ``buf``: (wait, test) of a posted ``irecv``, or done when blocking."""
        return self._meet(self.sends, self.recvs, tag, blocking, buf, lambda x: (x, buf))

    def _meet(self, theirs, mine, tag, blocking, kept, pair):
        """Deliver against the first pending operation of the other kind with ``tag`` (``pair``
        turns its tensor into (message, buffer)); else block for good, or queue ``kept`` in ``mine``."""
        other, flag = self._match(theirs, tag)
        if other is not None:
            self._deliver(*pair(other))
            flag.set()
            return (lambda: None), (lambda: True)
        if blocking:
            self._never()
        flag = threading.Event()
        mine.append((tag, kept, flag))
        return (lambda: flag.is_set() or self._never()), flag.is_set


class TorchComm(Comm):
    backend = "torch"

    def __init__(self, group, device, engine, tracer, watchdog, name="world"):
        _COMMS.add(self)
        size = dist.get_world_size(group)
        ranks = [dist.get_global_rank(group, r) if group is not None else r for r in range(size)]
        super().__init__(dist.get_rank(group), size, ranks, tracer, watchdog, name)
        self.group, self.device, self.engine = group, torch.device(device), engine
        self.staging = engine == "gloo" and self.device.type == "cuda"  # host staging
        self.builtin = TorchBuiltin(self)
        self.to_self = ToSelf()

    def _check_array(self, x, what, writable=False):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{what}: the torch backend works on torch tensors, got {type(x).__name__}; "
                            f"use minipar.init(backend='mpi') for NumPy arrays")
        if not x.is_contiguous():
            raise ValueError(f"{what}: tensor must be contiguous (call .contiguous())")
        return x

    # staging: what actually goes on the wire
    def _out(self, x):
        return x.cpu() if self.staging else x

    def _in(self, buf):
        return torch.empty(buf.shape, dtype=buf.dtype) if self.staging else buf

    def _kw(self, peer, key):
        return {"group": self.group, key: peer} if self.group is not None else {key[6:]: peer}

    def _wrap(self, op, peer, buf, fn):
        try:
            return fn()
        except RuntimeError as err:
            raise RuntimeError(f"{op} with rank {self.world_rank(peer)} failed (is buf the shape "
                               f"{tuple(buf.shape)} and dtype {buf.dtype} of what was sent?): {err}") from None

    def _send(self, x, dst, tag):
        if dst == self.rank:
            self.to_self.post(x, tag, blocking=True)
            return
        dist.send(self._out(x), tag=tag, **self._kw(dst, "group_dst"))

    def _recv(self, buf, src, tag):
        if src == self.rank:
            self.to_self.take(buf, tag, blocking=True)
            return buf
        tmp = self._in(buf)
        self._wrap("recv", src, buf, lambda: dist.recv(tmp, tag=tag, **self._kw(src, "group_src")))
        if tmp is not buf:
            buf.copy_(tmp)
        return buf

    def _isend(self, x, dst, tag):
        if dst == self.rank:
            return self.to_self.post(x, tag, blocking=False)
        work = dist.isend(self._out(x), tag=tag, **self._kw(dst, "group_dst"))
        return work.wait, lambda: work.is_completed() and work.wait()

    def _irecv(self, buf, src, tag):
        if src == self.rank:
            return self.to_self.take(buf, tag, blocking=False)
        tmp = self._in(buf)
        work = dist.irecv(tmp, tag=tag, **self._kw(src, "group_src"))

        def wait():
            self._wrap("irecv", src, buf, work.wait)
            if tmp is not buf:
                buf.copy_(tmp)
            return True

        return wait, lambda: work.is_completed() and wait()

    def _sendrecv(self, x, dst, buf, src, sendtag, recvtag):
        wait_recv, _ = self._irecv(buf, src, recvtag)
        wait_send, _ = self._isend(x, dst, sendtag)
        wait_send()
        wait_recv()
        return buf

    def _barrier(self):
        dist.barrier(group=self.group)

    def _split(self, color, key, name):
        everyone = _allgather_object(self, (color, key, self.world_rank(self.rank)))
        if color is None:
            # a group of this rank alone, never used: torch names a locally synchronized group by its
            # ranks and by how many groups this process holds (len(_world.pg_names)), so a rank that
            # made one group fewer than its future partners names their next group otherwise, and the
            # rendezvous under that name never completes (torch 2.13: two ends split off, then a grid)
            dist.new_group([self.world_rank(self.rank)], use_local_synchronization=True)
            return None
        members = sorted((k, w) for c, k, w in everyone if c == color)
        ranks = [w for _, w in members]
        if ranks != sorted(ranks) and not _KEEPS_ORDER:
            raise UsageError(f"split {name!r}: the key orders its ranks {ranks} unlike the world's, and this torch "
                             f"({torch.__version__}) can only make groups in the world's order (sort_ranks: torch >= 2.13)")
        group = dist.new_group(ranks, use_local_synchronization=True, **({"sort_ranks": False} if _KEEPS_ORDER else {}))
        return TorchComm(group, self.device, self.engine, self.tracer, self.watchdog, name)

    def empty(self, shape, dtype="float64"):
        dtype = dtype if isinstance(dtype, torch.dtype) else getattr(torch, str(dtype).replace("torch.", ""))
        return torch.empty(shape, dtype=dtype, device=self.device)  # dtype: "float64", or torch.float64 (x.dtype)

    def asarray(self, a):
        return torch.as_tensor(a).to(self.device).contiguous()


def _allgather_object(comm: TorchComm, obj) -> list:
    """Every rank's ``obj``, in rank order (torch's all_gather_object). ``split`` uses it
    directly: making a communicator is bookkeeping, not a builtin collective the lab grader
    refuses inside a learner's call (``comm.builtin`` calls are recorded there)."""
    out = [None] * comm.size
    comm.watchdog.call(f"builtin allgather_object on {comm.name}", dist.all_gather_object, out, obj, group=comm.group)
    return out


_DEFAULT: dict = {}  # device -> the TorchComm over a process group someone else initialised


def default_group_comm(device="cpu") -> TorchComm:
    """A communicator over torch.distributed's default group, which the user's script made itself
    (``dist.init_process_group("gloo")`` under torchrun or ``mp.spawn``): built on first use, then
    the same one. Its tracer starts off and its watchdog is off (the script's own process, not a
    minipar job: nothing of minipar's may abort it)."""
    if not dist.is_available() or not dist.is_initialized():
        raise UsageError("torch.distributed's process group is not initialised: call "
                         "dist.init_process_group('gloo') (or minipar.init('torch')) first")
    device = torch.device(device)
    comm = _DEFAULT.get(str(device))
    if comm is None or comm.size != dist.get_world_size():  # a new group since: a new communicator
        from ..trace import Tracer
        from .watchdog import Watchdog

        rank, size = dist.get_rank(), dist.get_world_size()
        comm = _DEFAULT[str(device)] = TorchComm(None, device, dist.get_backend(), Tracer(rank),
                                                 Watchdog(rank, size, 0, None, None))
    return comm


class TorchBuiltin:
    """torch.distributed's own collectives: the reference for tests and benchmarks."""

    def __init__(self, comm: TorchComm):
        self.comm, self.group = comm, comm.group

    def _run(self, name, fn, *args, **kw):
        c = self.comm
        return c.watchdog.call(f"builtin {name} on {c.name}", fn, *args, **kw)

    def _stage(self, x):
        return x.cpu().clone() if self.comm.staging else x.clone()

    def _back(self, t, like):
        return t.to(like.device)

    def all_reduce(self, x, op="sum"):
        out = self._stage(x.contiguous())
        self._run("all_reduce", dist.all_reduce, out, op=torch_op(op), group=self.group)
        return self._back(out, x)

    def broadcast(self, x, root=0):
        t = self._stage(x)
        self._run("broadcast", dist.broadcast, t, group_src=root, group=self.group)
        x.copy_(t)
        return x

    def reduce(self, x, root=0, op="sum"):
        t = self._stage(x.contiguous())
        self._run("reduce", dist.reduce, t, group_dst=root, op=torch_op(op), group=self.group)
        return self._back(t, x) if self.comm.rank == root else None

    def all_gather(self, x):
        """Concatenation along axis 0 (axis-0 lengths may differ: padded to the longest)."""
        rows = self.allgather_object(int(x.shape[0]))
        t = self._stage(x.contiguous())
        pad = torch.zeros((max(rows),) + tuple(x.shape[1:]), dtype=x.dtype, device=t.device)
        pad[: x.shape[0]] = t
        parts = [torch.empty_like(pad) for _ in rows]
        self._run("all_gather", dist.all_gather, parts, pad, group=self.group)
        return self._back(torch.cat([p[:n] for p, n in zip(parts, rows)]), x)

    def reduce_scatter(self, x, op="sum"):
        """This rank's chunk of the reduction. gloo has no reduce-scatter, so the reference
        here is all_reduce followed by taking the chunk (same numbers, more traffic)."""
        a, b = chunk_bounds(x.shape[0], self.comm.size)[self.comm.rank]
        return self.all_reduce(x, op)[a:b].clone()

    def all_to_all(self, x):
        t = self._stage(x.contiguous())
        sizes = [len(c) for c in torch.chunk(t, self.comm.size)]
        out = torch.empty_like(t)
        # all_to_all_single: gloo has no list all_to_all before torch 2.13, every engine has this one
        self._run("all_to_all", dist.all_to_all_single, out, t, sizes, sizes, group=self.group)
        return self._back(out, x)

    def all_to_all_v(self, x, send_counts):
        """(rows received, recv_counts), like ``collectives.all_to_all_v``."""
        send_counts = [int(c) for c in send_counts]
        everyone = self.allgather_object(send_counts)  # everyone[j][i]: rows j sends to i
        recv_counts = [everyone[j][self.comm.rank] for j in range(self.comm.size)]
        t = self._stage(x.contiguous())
        out = torch.empty((sum(recv_counts),) + tuple(x.shape[1:]), dtype=x.dtype, device=t.device)
        self._run("all_to_all_v", dist.all_to_all_single, out, t, recv_counts, send_counts, group=self.group)
        return self._back(out, x), recv_counts

    def barrier(self):
        self._run("barrier", dist.barrier, group=self.group)

    def bcast_object(self, obj, root=0):
        box = [obj]
        self._run("bcast_object", dist.broadcast_object_list, box, group_src=root, group=self.group)
        return box[0]

    def gather_object(self, obj, root=0):
        out = self.allgather_object(obj)
        return out if self.comm.rank == root else None

    def allgather_object(self, obj):
        return _allgather_object(self.comm, obj)

    def send_object(self, obj, dst, tag=77):
        self._run("send_object", dist.send_object_list, [obj], group_dst=dst, group=self.group)

    def recv_object(self, src, tag=77):
        box = [None]
        self._run("recv_object", dist.recv_object_list, box, group_src=src, group=self.group)
        return box[0]
