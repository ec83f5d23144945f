"""The bare WSGI app bench/http_bench.py compares Shoal's view against: no framework at all."""


def application(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "5")])
    return [b"hello"]
