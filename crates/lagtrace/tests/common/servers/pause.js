// A fast HTTP server whose event loop blocks PAUSE ms once a second (a synchronous job on
// a timer: a cache rebuild, a big JSON.parse, a sync fs call), for lagtrace's tests.
// Usage: node pause.js HOST PORT PAUSE_MS
const http = require('http');
const [host, port, pause] = [process.argv[2], +process.argv[3], +process.argv[4]];
http.createServer((req, res) => { res.end('ok\n'); }).listen(port, host);
setInterval(() => {
  const t = Date.now();
  while (Date.now() - t < pause) { /* the event loop is blocked */ }
}, 1000);
