"""Certificates and the names they serve, checked when the config loads: no sockets.

- ``tls_files``: read, check and load the TLS files of ``tls_server``/``tls_client``
  (PEM or PKCS#12), with what a reload compares.
- ``sni``: SNI routing's host names (the broker name template and the bootstrap name),
  and whether a certificate covers them.

Below ``config`` (which validates with them) and the proxy (which serves with them).
"""
