"""A Content-Security-Policy for the admin pages: scripts only from this site, nothing framed or embedded.

Django 5.2 has no CSP of its own. The admin's scripts are all files (no inline script), and its
styles and Shoal's SVG charts use inline ``<style>``, hence 'unsafe-inline' for styles only.
"""
ADMIN_PREFIX = "/admin/"
POLICY = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
          "object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'")


class AdminContentSecurityPolicyMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if request.path.startswith(ADMIN_PREFIX):
            response.headers.setdefault("Content-Security-Policy", POLICY)
        return response
