// A fast HTTP server (the JDK's com.sun.net.httpserver, a thread pool) whose handlers all
// need one lock that a housekeeping thread holds PAUSE ms once a second (a global lock, a
// stop-the-world phase), for lagtrace's tests. Usage: java Pause.java HOST PORT PAUSE_MS
import com.sun.net.httpserver.HttpServer;
import java.net.InetSocketAddress;
import java.util.concurrent.Executors;

public class Pause {
    static final Object LOCK = new Object();

    public static void main(String[] a) throws Exception {
        String host = a[0];
        int port = Integer.parseInt(a[1]);
        long pause = Long.parseLong(a[2]);
        byte[] body = "ok\n".getBytes();
        HttpServer s = HttpServer.create(new InetSocketAddress(host, port), 1024);
        s.createContext("/", x -> {
            synchronized (LOCK) { }
            x.sendResponseHeaders(200, body.length);
            x.getResponseBody().write(body);
            x.close();
        });
        s.setExecutor(Executors.newFixedThreadPool(8));
        s.start();
        Thread h = new Thread(() -> {
            while (true) {
                try {
                    Thread.sleep(1000 - pause);
                    synchronized (LOCK) { Thread.sleep(pause); }
                } catch (InterruptedException e) { return; }
            }
        });
        h.setDaemon(true);
        h.start();
    }
}
