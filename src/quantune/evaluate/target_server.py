"""The evaluation server that runs in a *target* Python environment (``target.python``).

A target is what the user deploys with (another onnxruntime build, maybe another Python), so the
server imports only the standard library, numpy, onnxruntime and its sibling ``interleave.py``
by path, never quantune's package; quantune starts it as ``TARGET_PYTHON target_server.py``.
Keep it Python 3.8-compatible.

Protocol: one JSON object per line each way, requests on stdin, answers on the original stdout,
which the server keeps for itself (native code printing to fd 1 goes to stderr, the client's
log). Arrays travel as ``.npz`` files the client names (``allow_pickle`` off). Ops: ``info``;
``load`` -> ``{"session", "providers", "open_s"}``; ``run`` (outputs written to ``out``);
``time`` (quantune's interleaved rounds; a null session sits out; no round starts ``seconds``
after the request once ``min_rounds`` ran); ``free``; ``memory`` -> ``{"peak_memory_mb"}``
measured in a forked child. ``--memory REQUEST.json`` does the last in a fresh process (for
platforms without ``fork``). An error answers ``{"error": "Type: message"}``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import sys
import threading
import time

_PARENT = os.getppid()


def _watch_parent(parent: int = _PARENT) -> None:
    """The server ends when quantune does (its parent is gone), even mid-request."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(1)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def build_session_options(ort, threads, timing, settings):
    """onnxruntime session options: quantune's ``session_options`` is this function, so both open sessions alike."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = int(threads)
    # idle threads sleep rather than spin: a spinning pool eats the cores a timing or an evaluation
    # beside another needs; spinning changes no output
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if timing:
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    levels = {
        "disable_all": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }
    modes = {"sequential": ort.ExecutionMode.ORT_SEQUENTIAL, "parallel": ort.ExecutionMode.ORT_PARALLEL}
    attributes = {
        "graph_optimization_level": lambda value: levels[str(value)],
        "execution_mode": lambda value: modes[str(value)],
        "inter_op_num_threads": int,
        "enable_mem_pattern": bool,
        "enable_cpu_mem_arena": bool,
        "intra_op_num_threads": int,  # a tuned session chose its own within the budget
    }
    for key, value in (settings or {}).items():
        if key in WHERE_KEYS:  # where the session runs, not how: open_session reads them
            continue
        if key in attributes:
            setattr(options, key, attributes[key](value))
        elif key == "config":
            for entry, entry_value in dict(value).items():
                options.add_session_config_entry(str(entry), str(entry_value))
        else:
            raise ValueError(f"unknown session setting '{key}'")
    return options


# Session settings that say where a candidate runs (``target.providers``): they replace the
# request's provider and its options, so a candidate measured on OpenVINO is loaded there always.
WHERE_KEYS = ("provider", "provider_options")


def chosen_provider(provider, provider_options, settings):
    """The provider and options a session opens with: the candidate's own (its settings), else the target's."""
    settings = settings or {}
    if settings.get("provider"):
        return settings["provider"], dict(settings.get("provider_options") or {})
    return provider or "CPUExecutionProvider", dict(provider_options or {})


def open_session(ort, request):
    provider, provider_options = chosen_provider(
        request.get("provider"), request.get("provider_options"), request.get("settings")
    )
    providers = [(provider, {str(k): str(v) for k, v in provider_options.items()}) if provider_options else provider]
    if provider != "CPUExecutionProvider":
        providers.append("CPUExecutionProvider")  # ops the provider does not take fall back to the CPU
    options = build_session_options(
        ort, request.get("threads", 1), request.get("timing", False), request.get("settings")
    )
    return ort.InferenceSession(request["model"], options, providers=providers)


def load_arrays(np, path, layout):
    with np.load(path, allow_pickle=False) as data:
        arrays = [data[f"a{index}"] for index in range(len(data.files))]
    feeds, position = [], 0
    for names in layout:
        feeds.append({name: arrays[position + offset] for offset, name in enumerate(names)})
        position += len(names)
    return feeds


def _runner(spec, cache):
    if not spec:
        return None
    if spec not in cache:
        path, _, name = spec.rpartition(":")
        folder = os.path.dirname(os.path.abspath(path))
        if folder not in sys.path:  # its helper modules import here too, as in quantune's processes
            sys.path.append(folder)
        module_spec = importlib.util.spec_from_file_location("quantune_target_runner", path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        cache[spec] = getattr(module, name)
    return cache[spec]


class Server:
    def __init__(self) -> None:
        import numpy as np
        import onnxruntime as ort

        self.np, self.ort = np, ort
        # the interleaved rounds are quantune's own loop, this file's sibling (it needs numpy only)
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "interleave.py")
        module_spec = importlib.util.spec_from_file_location("quantune_target_interleave", path)
        self.interleave = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(self.interleave)
        self.sessions = {}
        self.runners = {}
        self.next_id = 0

    def info(self, request):
        return {
            "onnxruntime": self.ort.__version__,
            "numpy": self.np.__version__,
            "python": platform.python_version(),
            "executable": sys.executable,
            "providers": list(self.ort.get_available_providers()),
            "cpu": cpu_name(),
            "pid": os.getpid(),
        }

    def load(self, request):
        started = time.perf_counter()  # the open alone (OpenVINO: compiling, or reading its model cache)
        session = open_session(self.ort, request)
        opened = time.perf_counter() - started
        self.next_id += 1
        self.sessions[self.next_id] = session
        return {"session": self.next_id, "providers": list(session.get_providers()), "open_s": opened}

    def run(self, request):
        session = self.sessions[request["session"]]
        feeds = load_arrays(self.np, request["feeds"], request["layout"])
        runner = _runner(request.get("runner"), self.runners)
        if runner is not None:
            outputs = [dict(item) for item in runner(session, feeds)]
        else:
            names = [out.name for out in session.get_outputs()]
            outputs = []
            for index, feed in enumerate(feeds):
                try:
                    outputs.append(dict(zip(names, session.run(names, feed))))  # noqa: B905 - Python 3.8
                except Exception as exc:
                    shapes = {name: tuple(value.shape) for name, value in feed.items()}
                    cause = " ".join(str(exc).split())
                    raise RuntimeError(f"onnxruntime failed on evaluation feed {index} {shapes}: {cause}") from None
        layout = [[str(name) for name in feed] for feed in outputs]
        arrays = [self.np.asarray(value) for feed in outputs for value in feed.values()]
        self.np.savez(request["out"], **{f"a{index}": value for index, value in enumerate(arrays)})
        return {"layout": layout}

    def time(self, request):
        (feed,) = load_arrays(self.np, request["feed"], [request["names"]])
        runner = _runner(request.get("runner"), self.runners)
        calls = []
        for ident in request["sessions"]:  # a null sits this request's rounds out (NaN there)
            session = self.sessions.get(ident)
            if session is None:
                calls.append(None)
            elif runner is None:
                calls.append(lambda s=session: s.run(None, feed))
            else:
                calls.append(lambda s=session: runner(s, [feed]))
        seconds = request.get("seconds")
        timings = self.interleave.interleaved(
            calls,
            int(request["repeats"]),
            first=int(request.get("first") or 0),
            warmup=int(request["warmup"]),
            warmup_s=request.get("warmup_seconds"),
            end=None if seconds is None else time.perf_counter() + float(seconds),
            fewest=int(request.get("min_rounds") or 5),
        )
        return {"timings": timings.tolist()}

    def free(self, request):
        self.sessions.clear()
        return {}

    def memory(self, request):
        """``measure_memory`` in a child forked from this server, which never opens a session (a
        freed session's resident heap would hide part of the next one's peak): every measurement
        starts from the same state without paying for a new interpreter."""
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child
            os.close(read_fd)
            threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
            try:
                answer = measure_memory(request)
            except BaseException as exc:
                answer = {"error": _describe(exc)}
            os.write(write_fd, json.dumps(answer).encode())
            os._exit(0)
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as pipe:
            data = pipe.read()
        _, status = os.waitpid(pid, 0)
        if not data:
            code = os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            raise RuntimeError(f"the memory probe died ({'signal' if os.WIFSIGNALED(status) else 'exit code'} {code})")
        answer = json.loads(data)
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return answer


def _describe(exc):
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def _rss_kb(field):
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return float(line.split()[1])
    raise OSError(field)


def measure_memory(request):
    """Peak resident memory (MB) a fresh session adds: loading ``model`` and running the feed once.
    The high-water mark is reset once the libraries and the feed are in memory, so only the session counts.
    """
    import numpy as np
    import onnxruntime as ort

    (feed,) = load_arrays(np, request["feed"], [request["names"]])
    reset = True
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        before = _rss_kb("VmRSS")
    except OSError:  # not Linux: the lifetime peak, from before the session
        import resource

        reset = False
        before = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    session = open_session(ort, request)
    runner = _runner(request.get("runner"), {})
    if runner is None:
        session.run(None, feed)
    else:
        runner(session, [feed])
    if reset:
        peak = _rss_kb("VmHWM")
    else:
        import resource

        peak = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return {"peak_memory_mb": max(0.0, peak - before) / 1024.0, "providers": list(session.get_providers())}


def serve(reply_fd):
    out = os.fdopen(reply_fd, "w", buffering=1)
    try:
        server = Server()
    except BaseException as exc:  # onnxruntime or numpy not importable: say so, then end
        out.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n")
        return 3
    out.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        try:
            answer = getattr(server, request["op"])(request)
        except Exception as exc:
            answer = {"error": _describe(exc)}
        out.write(json.dumps(answer) + "\n")
    return 0


def main(argv):
    threading.Thread(target=_watch_parent, daemon=True).start()
    # The protocol keeps the real stdout; anything else printing to fd 1 lands in stderr (the log).
    reply_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    if len(argv) == 3 and argv[1] == "--memory":
        with open(argv[2]) as handle:
            request = json.load(handle)
        try:
            answer = measure_memory(request)
        except Exception as exc:
            answer = {"error": _describe(exc)}
        with os.fdopen(reply_fd, "w") as out:
            out.write(json.dumps(answer) + "\n")
        return 0
    return serve(reply_fd)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
