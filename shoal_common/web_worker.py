"""gunicorn's gthread worker, which stops listening the moment it starts to drain, and is not recycled
while the code on disk cannot load (shoal_common/web_recycling.py).

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

from shoal_common import web_recycling


class ThreadWorker(GThreadWorker):
    def init_process(self):
        # gunicorn recycles once ``nr`` reaches ``max_requests``; keep the limit it drew (with jitter) and
        # move ``max_requests`` out of reach while the master holds recycling.
        self.recycle_at = self.max_requests
        self.recycling = web_recycling.WorkerView()
        self.recycle_deferred = False
        super().init_process()

    def handle_request(self, req, conn):
        if self.nr + 1 >= self.recycle_at:
            self.defer_recycling_while_held()
        return super().handle_request(req, conn)

    def handle_http2_request(self, req, conn, h2_conn):
        if self.nr + 1 >= self.recycle_at:
            self.defer_recycling_while_held()
        return super().handle_http2_request(req, conn, h2_conn)

    def defer_recycling_while_held(self):
        if self.recycling.held():
            if not self.recycle_deferred:
                self.recycle_deferred = True
                self.log.warning("Worker (pid:%s) reached max_requests (%s) while the master holds recycling (a "
                                 "rollout under way or aborted): it keeps serving with the code it loaded.", self.pid,
                                 self.recycle_at)
            self.max_requests = sys.maxsize
        else:
            self.max_requests = self.recycle_at
            self.recycle_deferred = False

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
