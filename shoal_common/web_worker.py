"""gunicorn's gthread worker, which stops listening the moment it starts to drain, and which the master
recycles (shoal_common/web_rollout.py): past its ``max_requests`` it asks the master for a replacement
and serves on until the master stops it, instead of exiting by itself.

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
import sys

from gunicorn.workers.gthread import ThreadWorker as GThreadWorker

from shoal_common import web_rollout


class ThreadWorker(GThreadWorker):
    def init_process(self):
        # gunicorn recycles once ``nr`` reaches ``max_requests``: keep the limit it drew (with jitter), and once
        # it is reached hand the decision to the master, which stops this worker when a replacement is ready.
        # Exiting first (gunicorn's way) left nothing serving when the replacement could not load the code on disk.
        self.recycle_at = self.max_requests
        self.recycle_asked = False
        super().init_process()

    def handle_request(self, req, conn):
        if not self.recycle_asked and self.nr + 1 >= self.recycle_at:
            self.ask_recycling()
        return super().handle_request(req, conn)

    def handle_http2_request(self, req, conn, h2_conn):
        if not self.recycle_asked and self.nr + 1 >= self.recycle_at:
            self.ask_recycling()
        return super().handle_http2_request(req, conn, h2_conn)

    def ask_recycling(self):
        # Out of reach first, then asked: another thread's request, past this check a moment later, compares
        # nr with max_requests in gunicorn's code; set after the write and the log line, it found the old
        # limit and the worker exited by itself ("Autorestarting worker"), as if nothing had been asked.
        self.max_requests = sys.maxsize  # gunicorn's own `nr >= max_requests` never comes true
        self.recycle_asked = True
        if web_rollout.ask_recycling():
            self.log.info("Worker (pid:%s) reached max_requests (%s): it serves until the master has its "
                          "replacement ready.", self.pid, self.recycle_at)
        else:
            self.max_requests = self.recycle_at  # not under Shoal's master: gunicorn's own recycling

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
