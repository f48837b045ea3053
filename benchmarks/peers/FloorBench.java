// The Java client's floor for benchmarks.floor: ZooKeeper's own client, no framework.
//
//   java FloorBench HOSTS request CALLS   one exists() round trip, CALLS times
//   java FloorBench HOSTS change CHANGES  a setData on one session reaching another session
//                                         that holds a data watch and reads the node again
//
// Prints one JSON line: {"samples_ms": [...]}. Each change is timed from before the write to
// the follower's read reply (the node's new data, with the watch set again), the same span
// the Python rows time.
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.SynchronousQueue;
import java.util.concurrent.TimeUnit;
import org.apache.zookeeper.CreateMode;
import org.apache.zookeeper.WatchedEvent;
import org.apache.zookeeper.Watcher;
import org.apache.zookeeper.ZooDefs;
import org.apache.zookeeper.ZooKeeper;

public class FloorBench {
    static ZooKeeper connect(String hosts) throws Exception {
        CountDownLatch connected = new CountDownLatch(1);
        ZooKeeper zk = new ZooKeeper(hosts, 10000, event -> {
            if (event.getState() == Watcher.Event.KeeperState.SyncConnected) connected.countDown();
        });
        if (!connected.await(10, TimeUnit.SECONDS)) throw new IllegalStateException("no connection");
        return zk;
    }

    static void print(List<Double> samples) {
        StringBuilder out = new StringBuilder("{\"samples_ms\": [");
        for (int i = 0; i < samples.size(); i++) {
            if (i > 0) out.append(", ");
            out.append(samples.get(i));
        }
        System.out.println(out.append("]}"));
    }

    public static void main(String[] args) throws Exception {
        String hosts = args[0];
        int count = Integer.parseInt(args[2]);
        List<Double> samples = new ArrayList<>();
        if (args[1].equals("request")) {
            ZooKeeper zk = connect(hosts);
            for (int i = 0; i < 500; i++) zk.exists("/", false);  // warm up, as the others do
            for (int i = 0; i < count; i++) {
                long started = System.nanoTime();
                zk.exists("/", false);
                samples.add((System.nanoTime() - started) / 1e6);
            }
            zk.close();
        } else {
            ZooKeeper writer = connect(hosts);
            ZooKeeper follower = connect(hosts);
            String path = "/floor-java-" + ProcessHandle.current().pid();
            writer.create(path, new byte[0], ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.EPHEMERAL);
            SynchronousQueue<byte[]> applied = new SynchronousQueue<>();
            Watcher[] watch = new Watcher[1];
            // On the event thread, as a cache would: read the node again, watch set again.
            watch[0] = (WatchedEvent event) -> {
                if (event.getType() != Watcher.Event.EventType.NodeDataChanged) return;
                follower.getData(path, watch[0], (rc, p, ctx, data, stat) -> {
                    try {
                        applied.put(data);
                    } catch (InterruptedException e) {
                        Thread.currentThread().interrupt();
                    }
                }, null);
            };
            follower.getData(path, watch[0], null);
            for (int i = 0; i < 100 + count; i++) {  // the first 100 warm up
                byte[] value = Integer.toString(i).getBytes();
                long started = System.nanoTime();
                writer.setData(path, value, -1);
                byte[] seen = applied.poll(10, TimeUnit.SECONDS);
                long elapsed = System.nanoTime() - started;
                if (seen == null || !new String(seen).equals(new String(value)))
                    throw new IllegalStateException("change " + i + " not applied");
                if (i >= 100) samples.add(elapsed / 1e6);
            }
            writer.close();
            follower.close();
        }
        print(samples);
    }
}
