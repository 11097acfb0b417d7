"""The board: an HTTP server (``server``) and its static page (``index.html``, ``board.css``,
``board.js``), served by ``tickets board`` on its own port; the Mediator's panel links to it.

Everything the page needs ships in this folder – nothing comes from a CDN – so the board works on a
closed network.
"""
