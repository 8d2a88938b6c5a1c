"""What someone who opens the server's address sees (a Hugging Face Space opens "/")."""

import httpx


def test_the_front_page_leads_to_the_web_ui_and_nothing_else(start_server):
    server = start_server("--token", "tok-front-page-1234567")
    r = httpx.get(server.url + "/", follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"] == "/web"
    assert httpx.get(server.url + "/", follow_redirects=True).url.path == "/web/login"  # the token is still asked for
    assert httpx.get(server.url + "/harnesses").status_code == 401
