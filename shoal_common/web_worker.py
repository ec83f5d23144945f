"""gunicorn's gthread worker, which stops listening the moment it starts to drain.

A stopping gthread worker unregisters its listening sockets from its poller but closes them only when it
exits: after its requests in flight, and after up to 2 s for its kept-alive connections
(STOP_KEEPALIVE_LINGER). Meanwhile the kernel goes on completing handshakes into the socket's accept queue,
which nobody reads, and the final close resets every one of them: ``ConnectionResetError`` 1.5 to 2 s
later, for clients that had already deregistered the instance, POSTs that cannot be retried among them.

Here the worker takes what is already queued (it serves those) and closes its copies of the listening
sockets at once. During a HUP the master and the new workers still hold the socket, which keeps
listening for them; on a stop the master has closed its copy first, so once the workers have closed
theirs a new connection is refused at once, which clients (DiscoveryClient too, even for a POST) retry
on another instance.

Imported by the master (gunicorn loads the worker class there): gunicorn only, no Django, no app code.
"""
from gunicorn.workers.gthread import ThreadWorker as GThreadWorker


class ThreadWorker(GThreadWorker):
    def set_accept_enabled(self, enabled):
        super().set_accept_enabled(enabled)
        if not enabled and not self.alive:  # the drain starts (not: too many connections for now)
            self.stop_listening()

    def stop_listening(self):
        for listener in self.sockets:
            if listener.sock is None:
                continue
            # Connections the kernel queued before now were made to this instance while it listened:
            # serve them (non-blocking accepts, until none is left) rather than reset them.
            while True:
                before = self.nr_conns
                self.accept(listener)
                if self.nr_conns == before:
                    break
            listener.close()
