"""The OpenAI-compatible HTTP front end (`pdcluster serve --http HOST:PORT`, docs/http.md): on the router's own event
loop, a client of the router like any other (bridge.py), speaking OpenAI's API (app.py, schema.py, shapes.py,
errors.py) through uvicorn (server.py)."""
