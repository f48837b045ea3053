// Apache Curator's service discovery run through the scenarios of benchmarks/compare.py.
// Compiled at run time against Debian's jars (libcurator-discovery-java); prints one JSON object.
//
//   java CuratorBench CONNECT_STRING SCENARIO [ARGS...]
//   scenarios: lookup CALLS | propagation COUNT INTERVAL_MS [trace] | rtt CALLS
//              | coldstart INSTANCES ROUNDS | ladder SERVICES INSTANCES CHANGES
//
// Lookup timing is symmetric with benchmarks/lookup.py: each call is timed between two clock
// reads and the median of an empty clock pair (two reads, nothing between: timerOverhead) is
// subtracted; neither side subtracts the cost of an empty method or function call.

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.stream.Collectors;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.state.ConnectionState;
import org.apache.curator.retry.ExponentialBackoffRetry;
import org.apache.curator.x.discovery.ServiceCache;
import org.apache.curator.x.discovery.ServiceDiscovery;
import org.apache.curator.x.discovery.ServiceDiscoveryBuilder;
import org.apache.curator.x.discovery.ServiceInstance;
import org.apache.curator.x.discovery.ServiceProvider;
import org.apache.curator.x.discovery.details.ServiceCacheListener;
import org.apache.curator.x.discovery.strategies.RoundRobinStrategy;
import org.apache.zookeeper.AddWatchMode;
import org.apache.zookeeper.Watcher;

public final class CuratorBench {
    private static final String BASE = "/curator-bench";

    public static void main(String[] args) throws Exception {
        String connect = args[0];
        String scenario = args[1];
        String json;
        switch (scenario) {
            case "lookup": json = lookup(connect, Integer.parseInt(args[2])); break;
            case "propagation":
                json = propagation(connect, Integer.parseInt(args[2]), Integer.parseInt(args[3]),
                    args.length > 4 && args[4].equals("trace"));
                break;
            case "rtt": json = rtt(connect, Integer.parseInt(args[2])); break;
            case "coldstart":
                json = coldstart(connect, Integer.parseInt(args[2]), Integer.parseInt(args[3]));
                break;
            case "ladder":
                json = ladder(connect, Integer.parseInt(args[2]), Integer.parseInt(args[3]),
                    Integer.parseInt(args[4]));
                break;
            default: throw new IllegalArgumentException("unknown scenario " + scenario);
        }
        System.out.println(json);
        System.exit(0);
    }

    private static CuratorFramework client(String connect) throws InterruptedException {
        CuratorFramework client = CuratorFrameworkFactory.newClient(
            connect, 10_000, 10_000, new ExponentialBackoffRetry(100, 5));
        client.start();
        client.blockUntilConnected();
        return client;
    }

    private static ServiceDiscovery<Void> discovery(CuratorFramework client) throws Exception {
        ServiceDiscovery<Void> discovery = ServiceDiscoveryBuilder.builder(Void.class)
            .client(client).basePath(BASE).build();
        discovery.start();
        return discovery;
    }

    private static ServiceInstance<Void> instance(String service, String id, int i)
            throws Exception {
        return ServiceInstance.<Void>builder().name(service).id(id)
            .address("10.0." + (i / 250) + "." + (i % 250)).port(8080).build();
    }

    /** Warm getInstance() with round robin over 20 instances, timed call by call. */
    private static String lookup(String connect, int calls) throws Exception {
        CuratorFramework client = client(connect);
        ServiceDiscovery<Void> discovery = discovery(client);
        for (int i = 0; i < 20; i++) discovery.registerService(instance("api", "api-" + i, i));
        ServiceProvider<Void> provider = discovery.serviceProviderBuilder().serviceName("api")
            .providerStrategy(new RoundRobinStrategy<>()).build();
        provider.start();
        while (provider.getAllInstances().size() < 20) Thread.sleep(10);
        for (int i = 0; i < 2_000_000; i++) provider.getInstance();  // let the JIT compile it
        long overhead = timerOverhead(calls);
        long[] samples = new long[calls];
        for (int i = 0; i < calls; i++) {
            long start = System.nanoTime();
            provider.getInstance();
            samples[i] = Math.max(System.nanoTime() - start - overhead, 0);
        }
        long started = System.nanoTime();
        for (int i = 0; i < calls; i++) provider.getInstance();
        double seconds = (System.nanoTime() - started) / 1e9;
        Arrays.sort(samples);
        provider.close();
        discovery.close();
        client.close();
        StringBuilder quantiles = new StringBuilder();
        for (int q = 0; q <= 100; q++) {
            quantiles.append(q > 0 ? ", " : "").append(String.format("%.4f",
                rank(samples, Math.max(q, 1) / 100.0) / 1e3));
        }
        return String.format(
            "{\"p50_us\": %.4f, \"p95_us\": %.4f, \"p99_us\": %.4f, \"calls_per_s\": %.1f, "
            + "\"quantiles_us\": [%s]}",
            rank(samples, 0.50) / 1e3, rank(samples, 0.95) / 1e3, rank(samples, 0.99) / 1e3,
            calls / seconds, quantiles);
    }

    /** Median of an empty System.nanoTime() pair: benchmarks.lookup.timer_overhead's twin. */
    private static long timerOverhead(int calls) {
        long[] samples = new long[calls];
        for (int i = 0; i < calls; i++) {
            long start = System.nanoTime();
            samples[i] = System.nanoTime() - start;
        }
        Arrays.sort(samples);
        return rank(samples, 0.50);
    }

    private static long rank(long[] sorted, double q) {
        int index = (int) Math.round(q * sorted.length) - 1;
        return sorted[Math.min(sorted.length - 1, Math.max(0, index))];
    }

    /**
     * Registration and deregistration seen by a ServiceCache of another client (its own
     * ZooKeeper session, in this JVM): milliseconds from just before the write to the
     * cacheChanged() call that first shows it.
     */
    private static String propagation(String connect, int count, int intervalMs, boolean trace)
            throws Exception {
        CuratorFramework readerClient = client(connect);
        ServiceDiscovery<Void> reader = discovery(readerClient);
        ServiceCache<Void> cache = reader.serviceCacheBuilder().name("prop").build();
        Map<String, Long> arrived = new ConcurrentHashMap<>();
        Map<String, Long> departed = new ConcurrentHashMap<>();
        Set<String> known = ConcurrentHashMap.newKeySet();
        cache.addListener(new ServiceCacheListener() {
            @Override public void cacheChanged() {
                long now = System.nanoTime();
                Set<String> ids = cache.getInstances().stream().map(ServiceInstance::getId)
                    .collect(Collectors.toSet());
                for (String id : ids) if (known.add(id)) arrived.putIfAbsent(id, now);
                for (String id : new HashSet<>(known)) {
                    if (!ids.contains(id)) { known.remove(id); departed.putIfAbsent(id, now); }
                }
            }
            @Override public void stateChanged(CuratorFramework c, ConnectionState s) { }
        });
        cache.start();
        // trace (benchmarks.departure): when the reader's ZooKeeper client hands each event to
        // a watcher on its event thread, where the cache's own watcher gets it too
        Map<String, Long> created = new ConcurrentHashMap<>();
        Map<String, Long> deleted = new ConcurrentHashMap<>();
        if (trace) {
            readerClient.getZookeeperClient().getZooKeeper().addWatch(BASE + "/prop", event -> {
                long now = System.nanoTime();
                String path = event.getPath();
                if (path == null) return;
                String id = path.substring(path.lastIndexOf('/') + 1);
                if (event.getType() == Watcher.Event.EventType.NodeCreated) created.putIfAbsent(id, now);
                if (event.getType() == Watcher.Event.EventType.NodeDeleted) deleted.putIfAbsent(id, now);
            }, AddWatchMode.PERSISTENT_RECURSIVE);
        }
        CuratorFramework writerClient = client(connect);
        ServiceDiscovery<Void> writer = discovery(writerClient);
        for (int i = 0; i < 20; i++) {  // warm-up, not measured: class loading and the JIT
            ServiceInstance<Void> warm = instance("prop", "warm-" + i, i);
            writer.registerService(warm);
            Thread.sleep(intervalMs);
            writer.unregisterService(warm);
            Thread.sleep(intervalMs);
        }
        List<ServiceInstance<Void>> instances = new ArrayList<>();
        long[] registerStart = new long[count];
        long[] deregisterStart = new long[count];
        for (int i = 0; i < count; i++) {
            ServiceInstance<Void> instance = instance("prop", "new-" + i, i);
            registerStart[i] = System.nanoTime();
            writer.registerService(instance);
            instances.add(instance);
            Thread.sleep(intervalMs);
        }
        for (int i = 0; i < count; i++) {
            deregisterStart[i] = System.nanoTime();
            writer.unregisterService(instances.get(i));
            Thread.sleep(intervalMs);
        }
        long deadline = System.nanoTime() + 5_000_000_000L;
        while ((arrived.size() < count + 20 || departed.size() < count + 20)
                && System.nanoTime() < deadline) {
            Thread.sleep(10);
        }
        StringBuilder out = new StringBuilder("{\"register_ms\": [");
        for (int i = 0; i < count; i++) {
            Long at = arrived.get("new-" + i);
            out.append(i > 0 ? ", " : "")
               .append(at == null ? "null" : String.format("%.4f", (at - registerStart[i]) / 1e6));
        }
        out.append("], \"deregister_ms\": [");
        for (int i = 0; i < count; i++) {
            Long at = departed.get("new-" + i);
            out.append(i > 0 ? ", " : "")
               .append(at == null ? "null" : String.format("%.4f", (at - deregisterStart[i]) / 1e6));
        }
        // When each write began, on the machine's monotonic clock (System.nanoTime is
        // CLOCK_MONOTONIC, as Python's time.monotonic_ns): another process's cache following
        // the same writes times itself against these (benchmarks.curator_interop).
        out.append("], \"register_start_ns\": [");
        for (int i = 0; i < count; i++) out.append(i > 0 ? ", " : "").append(registerStart[i]);
        out.append("], \"deregister_start_ns\": [");
        for (int i = 0; i < count; i++) out.append(i > 0 ? ", " : "").append(deregisterStart[i]);
        out.append("]");
        if (trace) {
            out.append(", \"register_event_ns\": [");
            for (int i = 0; i < count; i++) {
                out.append(i > 0 ? ", " : "").append(created.getOrDefault("new-" + i, 0L));
            }
            out.append("], \"deregister_event_ns\": [");
            for (int i = 0; i < count; i++) {
                out.append(i > 0 ? ", " : "").append(deleted.getOrDefault("new-" + i, 0L));
            }
            out.append("]");
        }
        out.append("}");
        cache.close();
        writer.close();
        reader.close();
        writerClient.close();
        readerClient.close();
        return out.toString();
    }

    /** The client library's own round trip: exists("/") timed call by call, after warm-up. */
    private static String rtt(String connect, int calls) throws Exception {
        CuratorFramework client = client(connect);
        for (int i = 0; i < 500; i++) client.checkExists().forPath("/");
        long[] samples = new long[calls];
        for (int i = 0; i < calls; i++) {
            long start = System.nanoTime();
            client.checkExists().forPath("/");
            samples[i] = System.nanoTime() - start;
        }
        Arrays.sort(samples);
        client.close();
        return String.format("{\"p50_ms\": %.4f, \"p99_ms\": %.4f}",
            rank(samples, 0.50) / 1e6, rank(samples, 0.99) / 1e6);
    }

    /** A fresh client until its ServiceCache holds every instance of a big service; RSS. */
    private static String coldstart(String connect, int instances, int rounds) throws Exception {
        CuratorFramework writerClient = client(connect);
        ServiceDiscovery<Void> writer = discovery(writerClient);
        for (int i = 0; i < instances; i++) writer.registerService(instance("big", "big-" + i, i));
        List<String> timings = new ArrayList<>();
        long rssKb = 0;
        for (int round = 0; round < rounds; round++) {
            long started = System.nanoTime();
            CuratorFramework client = client(connect);
            ServiceDiscovery<Void> discovery = discovery(client);
            ServiceCache<Void> cache = discovery.serviceCacheBuilder().name("big").build();
            cache.start();
            while (cache.getInstances().size() < instances) Thread.sleep(1);
            timings.add(String.format("%.4f", (System.nanoTime() - started) / 1e9));
            System.gc();
            rssKb = rss();
            cache.close();
            discovery.close();
            client.close();
        }
        writer.close();
        writerClient.close();
        return "{\"total_s\": [" + String.join(", ", timings) + "], \"rss_mb\": "
            + String.format("%.1f", rssKb / 1024.0) + "}";
    }

    /**
     * benchmarks.ladder's rung: a ServiceCache on each of SERVICES services (s0, s1, ...)
     * that a twin registry already holds, INSTANCES in all. Cold start until every cache
     * holds them, heap used after a GC, then CHANGES registrations into s0 seen by its cache.
     */
    private static String ladder(String connect, int services, int instances, int changes)
            throws Exception {
        long started = System.nanoTime();
        CuratorFramework client = client(connect);
        ServiceDiscovery<Void> discovery = discovery(client);
        List<ServiceCache<Void>> caches = new ArrayList<>();
        for (int s = 0; s < services; s++) {
            ServiceCache<Void> cache = discovery.serviceCacheBuilder().name("s" + s).build();
            cache.start();
            caches.add(cache);
        }
        // A rung Curator cannot load (a listing over jute.maxbuffer is a connection loss,
        // retried for ever) is reported with what it held after two minutes.
        long deadline = System.nanoTime() + 120_000_000_000L;
        int held = 0;
        while (System.nanoTime() < deadline) {
            held = 0;
            for (ServiceCache<Void> cache : caches) held += cache.getInstances().size();
            if (held >= instances) break;
            Thread.sleep(5);
        }
        double coldS = (System.nanoTime() - started) / 1e9;
        if (held < instances) {
            return String.format("{\"held\": %d, \"gave_up_after_s\": %.1f}", held, coldS);
        }
        System.gc();
        Runtime runtime = Runtime.getRuntime();
        long heapUsed = runtime.totalMemory() - runtime.freeMemory();
        long rssKb = rss();
        ServiceCache<Void> first = caches.get(0);
        Map<String, Long> arrived = new ConcurrentHashMap<>();
        first.addListener(new ServiceCacheListener() {
            @Override public void cacheChanged() {
                long now = System.nanoTime();
                for (ServiceInstance<Void> i : first.getInstances()) arrived.putIfAbsent(i.getId(), now);
            }
            @Override public void stateChanged(CuratorFramework c, ConnectionState s) { }
        });
        CuratorFramework writerClient = client(connect);
        ServiceDiscovery<Void> writer = discovery(writerClient);
        List<String> delays = new ArrayList<>();
        for (int i = 0; i < changes; i++) {
            String id = "extra-" + i;
            long begun = System.nanoTime();
            writer.registerService(instance("s0", id, i));
            long until = System.nanoTime() + 30_000_000_000L;
            while (!arrived.containsKey(id) && System.nanoTime() < until) Thread.sleep(1);
            Long at = arrived.get(id);
            delays.add(at == null ? "null" : String.format("%.4f", (at - begun) / 1e6));
        }
        return String.format("{\"held\": %d, \"cold_s\": %.4f, \"heap_used_mb\": %.1f, \"rss_mb\": %.1f, "
            + "\"register_ms\": [%s]}", held, coldS, heapUsed / 1048576.0, rssKb / 1024.0,
            String.join(", ", delays));
    }

    private static long rss() throws Exception {
        for (String line : Files.readAllLines(Path.of("/proc/self/status"))) {
            if (line.startsWith("VmRSS:")) return Long.parseLong(line.replaceAll("\\D", ""));
        }
        return 0;
    }
}
