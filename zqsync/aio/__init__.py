"""zqsync for asyncio: `AsyncClient` (``await enqueue``, ``await call``, ``await result``) and
`AsyncTask` (``await AsyncTask(add).acall(1, 2)``), over the sync client's wire.

``client.py`` sends; ``pool.py`` leases ``zmq.asyncio`` sockets per running event loop and per
process; ``transport.py`` bounds each send and receive; ``lookups.py`` finds and waits for jobs;
``tasks.py`` has the task handles and the default client. docs/guides/asyncio.md is the guide.
Importing this package imports pyzmq's asyncio support, not gevent.
"""

from .client import AsyncClient, AsyncJob
from .pool import AsyncSocketPool
from .tasks import AsyncTask, default_client

__all__ = ["AsyncClient", "AsyncJob", "AsyncSocketPool", "AsyncTask", "default_client"]
