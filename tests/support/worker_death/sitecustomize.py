"""Test hook: a worker process dies for real on a chosen input (never the main process).

On ``sys.path`` (through PYTHONPATH) only in the worker-death tests, with
``PACKER_TEST_WORKER_DEATH=KEY:SIGNAL``: every Python process of the run (the packer process,
its pool workers, Ray's workers, which inherit the environment) wraps the per-item work of
image packing and ``decode-frames`` so that the worker given the item ``KEY`` sends itself
``SIGNAL`` (SIGKILL: the OOM killer; SIGSEGV: a decoder crash). The first process records its
pid, so the packer process itself never dies.
"""
import os

_spec = os.environ.get("PACKER_TEST_WORKER_DEATH")
if _spec:
    os.environ.setdefault("PACKER_TEST_MAIN_PID", str(os.getpid()))
    _key, _sig = _spec.rsplit(":", 1)

    def _arm() -> None:
        import faulthandler
        import signal

        from packer.commands import decode_frames, pack_images

        def wrap(cls):
            real = cls.__call__

            def __call__(self, item):
                if item.key == _key and os.getpid() != int(os.environ["PACKER_TEST_MAIN_PID"]):
                    faulthandler.disable()
                    os.kill(os.getpid(), getattr(signal, _sig))
                return real(self, item)

            cls.__call__ = __call__

        wrap(pack_images.ImageJob)
        wrap(decode_frames.FrameJob)
        from packer.conversion.plans import staged  # the staged plan runs only verdict() in workers

        real_verdict = staged.VerdictJob.verdict

        def verdict(self, item):
            if item.key == _key and os.getpid() != int(os.environ["PACKER_TEST_MAIN_PID"]):
                faulthandler.disable()
                os.kill(os.getpid(), getattr(signal, _sig))
            return real_verdict(self, item)

        staged.VerdictJob.verdict = verdict

    try:
        _arm()
    except Exception:  # a process that cannot import packer (a Ray helper) does no work
        pass
