// A Java service registry written by Apache Curator's x-discovery, for the interop tests.
// Compiled at test time against Debian's jars (libcurator-discovery-java); prints one JSON
// object: what Curator's own ServiceProvider returns for each service written.
//
//   java CuratorRegistry CONNECT_STRING BASE_PATH
//   java CuratorRegistry CONNECT_STRING BASE_PATH discover SERVICE
//   java CuratorRegistry CONNECT_STRING BASE_PATH instances SERVICE ID=ADDRESS:PORT:SHARD...
//   java CuratorRegistry CONNECT_STRING serve
//
// serve: one JVM and one Curator session for many tests (a JVM start costs a CI core about a
// second and a half). Each line on stdin is a command, answered by one JSON line: "registry
// BASE", "instances BASE SERVICE SPEC...", "spring-instances BASE SERVICE SPEC..." (what the
// modes of those names register, live until "close BASE"), "close BASE", "discover BASE
// SERVICE", "spring-discover BASE SERVICE"; a command that throws answers {"failed": "..."}.
// It exits when stdin closes. What each command registers or reads is what the one-shot mode
// of its name does, on this peer's session instead of a session of its own.
//
// discover: what Curator's ServiceProvider sees of SERVICE (instances written by Python), as
// {"ids": [...], "uris": [...], "one": ID or null, "payloads": {ID: payload}}, then exit.
// spring-instances SERVICE ID=ADDRESS:PORT...: register instances as a Spring Boot service
// does (a ServiceDiscovery typed to Spring Cloud's ZookeeperInstance, metadata {"zone":
// "eu-1"}), print {"registered": N}, live until a line on stdin.
// spring-discover SERVICE: every instance of SERVICE read by a ServiceDiscovery typed to
// ZookeeperInstance (queryForInstances, as Spring's DiscoveryClient reads), as
// {"ids": [...], "metadata": {ID: {...}}}, or {"error": "<exception class>: <message>"}.
//
// Under BASE_PATH it registers, in Curator's current JSON: "orders" with an instance of each
// shape (a plain port and a uriSpec, an sslPort only, both ports, disabled, a static one, a
// Map payload shaped as Spring Cloud Zookeeper's ZookeeperInstance), and under
// BASE_PATH + "-compat" the same plain instance with compatibleSerializationMode (the format
// before CURATOR-275, without "enabled"). Then it waits for a line on stdin and exits, so its
// session and its ephemeral nodes live until the test is done reading (or kills it).

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.TreeSet;
import java.util.stream.Collectors;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.retry.ExponentialBackoffRetry;
import org.apache.curator.x.discovery.ServiceDiscovery;
import org.apache.curator.x.discovery.ServiceDiscoveryBuilder;
import org.apache.curator.x.discovery.ServiceInstance;
import org.apache.curator.x.discovery.ServiceProvider;
import org.apache.curator.x.discovery.ServiceType;
import org.apache.curator.x.discovery.UriSpec;
import org.apache.curator.x.discovery.details.JsonInstanceSerializer;
import org.springframework.cloud.zookeeper.discovery.ZookeeperInstance;

public final class CuratorRegistry {
    @SuppressWarnings({"rawtypes", "unchecked"})
    public static void main(String[] args) throws Exception {
        // A 4 s session (Curator's default is 60 s): a killed peer's instances go within it.
        CuratorFramework client = CuratorFrameworkFactory.newClient(
            args[0], 4000, 10000, new ExponentialBackoffRetry(100, 3));
        client.start();
        client.blockUntilConnected();
        if (args[1].equals("serve")) {
            serve(client);
            return;
        }
        String base = args[1];
        if (args.length > 3 && args[2].equals("discover")) {
            System.out.println(discover(client, base, args[3]));
            client.close();
            return;
        }
        if (args.length > 3 && args[2].equals("spring-discover")) {
            System.out.println(springDiscover(client, base, args[3]));
            client.close();
            return;
        }
        if (args.length > 3 && args[2].equals("spring-instances")) {
            Registered registered = springInstances(
                client, base, args[3], java.util.Arrays.copyOfRange(args, 4, args.length));
            liveUntilALine(client, registered);
            return;
        }
        if (args.length > 3 && args[2].equals("instances")) {
            Registered registered = instances(
                client, base, args[3], java.util.Arrays.copyOfRange(args, 4, args.length));
            liveUntilALine(client, registered);
            return;
        }
        liveUntilALine(client, registry(client, base));
    }

    // What a command registered: its answer, and the discoveries whose close() takes it away.
    private static final class Registered {
        final String answer;
        final ServiceDiscovery<?>[] discoveries;

        Registered(String answer, ServiceDiscovery<?>... discoveries) {
            this.answer = answer;
            this.discoveries = discoveries;
        }

        void close() throws Exception {
            for (int i = discoveries.length - 1; i >= 0; i--) {
                discoveries[i].close();
            }
        }
    }

    // The one-shot modes: print the answer, live until a line on stdin (or a kill), then close.
    private static void liveUntilALine(CuratorFramework client, Registered registered)
            throws Exception {
        System.out.println(registered.answer);
        System.out.flush();
        new BufferedReader(new InputStreamReader(System.in)).readLine();
        registered.close();
        client.close();
    }

    private static void serve(CuratorFramework client) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        Map<String, Registered> live = new LinkedHashMap<>();
        for (String line = in.readLine(); line != null; line = in.readLine()) {
            String[] words = line.trim().split(" ");
            String answer;
            try {
                answer = command(client, live, words);
            } catch (Exception e) {
                answer = "{\"failed\": \"" + (e.getClass().getName() + ": " + e.getMessage())
                    .replace("\\", "\\\\").replace("\"", "\\\"") + "\"}";
            }
            System.out.println(answer);
            System.out.flush();
        }
        for (Registered registered : live.values()) {
            registered.close();
        }
        client.close();
    }

    private static String command(CuratorFramework client, Map<String, Registered> live,
            String[] words) throws Exception {
        String[] specs = java.util.Arrays.copyOfRange(words, Math.min(3, words.length), words.length);
        Registered registered;
        switch (words[0]) {
            case "registry":
                registered = registry(client, words[1]);
                break;
            case "instances":
                registered = instances(client, words[1], words[2], specs);
                break;
            case "spring-instances":
                registered = springInstances(client, words[1], words[2], specs);
                break;
            case "close":
                Registered closing = live.remove(words[1]);
                if (closing == null) {
                    throw new IllegalArgumentException("nothing registered under " + words[1]);
                }
                closing.close();
                return "{\"closed\": \"" + words[1] + "\"}";
            case "discover":
                return discover(client, words[1], words[2]);
            case "spring-discover":
                return springDiscover(client, words[1], words[2]);
            default:
                throw new IllegalArgumentException("unknown command " + words[0]);
        }
        if (live.containsKey(words[1])) {
            registered.close();
            throw new IllegalArgumentException(words[1] + " is registered already");
        }
        live.put(words[1], registered);
        return registered.answer;
    }

    // Under BASE: "orders" with an instance of each shape; under BASE-compat the plain one in
    // the compatible serialization mode. The answer: what Curator's ServiceProvider returns.
    @SuppressWarnings({"rawtypes", "unchecked"})
    private static Registered registry(CuratorFramework client, String base) throws Exception {
        ServiceDiscovery<Map> discovery = ServiceDiscoveryBuilder.builder(Map.class)
            .client(client).basePath(base).build();
        discovery.start();
        Map<String, Object> metadata = new LinkedHashMap<>();
        metadata.put("tenant-group", "p1");
        metadata.put("zone", "eu-1");
        Map<String, Object> spring = new LinkedHashMap<>();
        spring.put("id", "orders-1");
        spring.put("name", "orders");
        spring.put("metadata", metadata);

        discovery.registerService(ServiceInstance.<Map>builder().name("orders").id("plain")
            .address("10.0.0.1").port(8080).uriSpec(new UriSpec("{scheme}://{address}:{port}/v1"))
            .build());
        discovery.registerService(ServiceInstance.<Map>builder().name("orders").id("ssl-only")
            .address("10.0.0.2").sslPort(8443).build());
        discovery.registerService(ServiceInstance.<Map>builder().name("orders").id("both")
            .address("10.0.0.3").port(80).sslPort(443)
            .uriSpec(new UriSpec("{scheme}://{address}:{ssl-port}/{name}/{id}[x]")).build());
        discovery.registerService(ServiceInstance.<Map>builder().name("orders").id("disabled")
            .address("10.0.0.4").port(8080).enabled(false).build());
        discovery.registerService(ServiceInstance.<Map>builder().name("orders").id("static")
            .address("10.0.0.5").port(8080).serviceType(ServiceType.STATIC).build());
        discovery.registerService(ServiceInstance.<Map>builder().name("orders").id("spring")
            .address("10.0.0.6").port(8080).payload(spring).build());

        ServiceDiscovery<Map> compat = ServiceDiscoveryBuilder.builder(Map.class)
            .client(client).basePath(base + "-compat")
            .serializer(new JsonInstanceSerializer<>(Map.class, true)).build();
        compat.start();
        compat.registerService(ServiceInstance.<Map>builder().name("orders").id("old")
            .address("10.0.0.7").port(8080).payload(spring).build());

        StringBuilder out = new StringBuilder("{");
        String[][] providers = {{"current", base}, {"compat", base + "-compat"}};
        for (int i = 0; i < providers.length; i++) {
            ServiceDiscovery<Map> from = i == 0 ? discovery : compat;
            ServiceProvider<Map> provider = from.serviceProviderBuilder().serviceName("orders").build();
            provider.start();
            TreeSet<String> ids = provider.getAllInstances().stream()
                .map(ServiceInstance::getId).collect(Collectors.toCollection(TreeSet::new));
            TreeSet<String> uris = provider.getAllInstances().stream()
                .filter(s -> s.getUriSpec() != null).map(s -> s.buildUriSpec())
                .collect(Collectors.toCollection(TreeSet::new));
            provider.close();
            out.append(i == 0 ? "" : ", ").append('"').append(providers[i][0]).append("\": {\"ids\": [")
                .append(ids.stream().map(s -> '"' + s + '"').collect(Collectors.joining(", ")))
                .append("], \"uris\": [")
                .append(uris.stream().map(s -> '"' + s + '"').collect(Collectors.joining(", ")))
                .append("]}");
        }
        return new Registered(out.append("}").toString(), discovery, compat);
    }

    // instances SERVICE ID=ADDRESS:PORT:SHARD...: one instance each, its payload shaped as
    // Spring Cloud Zookeeper's ZookeeperInstance with metadata {"shard": SHARD}; answers
    // {"registered": N}.
    @SuppressWarnings({"rawtypes", "unchecked"})
    private static Registered instances(CuratorFramework client, String base, String service,
            String[] specs) throws Exception {
        ServiceDiscovery<Map> discovery = ServiceDiscoveryBuilder.builder(Map.class)
            .client(client).basePath(base).build();
        discovery.start();
        for (String spec : specs) {
            String[] idRest = spec.split("=", 2);
            String[] parts = idRest[1].split(":");
            Map<String, Object> metadata = new LinkedHashMap<>();
            metadata.put("shard", parts[2]);
            Map<String, Object> payload = new LinkedHashMap<>();
            payload.put("id", service + "-" + idRest[0]);
            payload.put("name", service);
            payload.put("metadata", metadata);
            discovery.registerService(ServiceInstance.<Map>builder().name(service).id(idRest[0])
                .address(parts[0]).port(Integer.parseInt(parts[1])).payload(payload).build());
        }
        return new Registered("{\"registered\": " + specs.length + "}", discovery);
    }

    private static Registered springInstances(CuratorFramework client, String base,
            String service, String[] specs) throws Exception {
        ServiceDiscovery<ZookeeperInstance> discovery = ServiceDiscoveryBuilder
            .builder(ZookeeperInstance.class).client(client).basePath(base).build();
        discovery.start();
        for (String spec : specs) {
            String[] idRest = spec.split("=", 2);
            String[] parts = idRest[1].split(":");
            Map<String, String> metadata = new LinkedHashMap<>();
            metadata.put("zone", "eu-1");
            discovery.registerService(ServiceInstance.<ZookeeperInstance>builder().name(service)
                .id(idRest[0]).address(parts[0]).port(Integer.parseInt(parts[1]))
                .payload(new ZookeeperInstance(service + "-" + idRest[0], service, metadata))
                .build());
        }
        return new Registered("{\"registered\": " + specs.length + "}", discovery);
    }

    private static String springDiscover(CuratorFramework client, String base, String service)
            throws Exception {
        ServiceDiscovery<ZookeeperInstance> discovery = ServiceDiscoveryBuilder
            .builder(ZookeeperInstance.class).client(client).basePath(base).build();
        discovery.start();
        try {
            StringBuilder ids = new StringBuilder();
            StringBuilder metadata = new StringBuilder();
            for (ServiceInstance<ZookeeperInstance> instance : discovery.queryForInstances(service)
                    .stream().sorted((a, b) -> a.getId().compareTo(b.getId()))
                    .collect(Collectors.toList())) {
                String sep = ids.length() == 0 ? "" : ", ";
                ids.append(sep).append('"').append(instance.getId()).append('"');
                ZookeeperInstance payload = instance.getPayload();  // the cast Spring makes
                metadata.append(sep).append('"').append(instance.getId()).append("\": {")
                    .append(payload.getMetadata().entrySet().stream()
                        .map(e -> '"' + e.getKey() + "\": \"" + e.getValue() + '"')
                        .collect(Collectors.joining(", ")))
                    .append('}');
            }
            return "{\"ids\": [" + ids + "], \"metadata\": {" + metadata + "}}";
        } catch (RuntimeException e) {
            return "{\"error\": \"" + e.getClass().getName() + "\"}";
        } finally {
            discovery.close();
        }
    }

    @SuppressWarnings({"rawtypes", "unchecked"})
    private static String discover(CuratorFramework client, String base, String service)
            throws Exception {
        ServiceDiscovery<Map> discovery = ServiceDiscoveryBuilder.builder(Map.class)
            .client(client).basePath(base).build();
        discovery.start();
        ServiceProvider<Map> provider = discovery.serviceProviderBuilder().serviceName(service).build();
        provider.start();
        StringBuilder ids = new StringBuilder();
        StringBuilder uris = new StringBuilder();
        StringBuilder payloads = new StringBuilder();
        for (ServiceInstance<Map> instance : provider.getAllInstances().stream()
                .sorted((a, b) -> a.getId().compareTo(b.getId())).collect(Collectors.toList())) {
            String sep = ids.length() == 0 ? "" : ", ";
            ids.append(sep).append('"').append(instance.getId()).append('"');
            if (instance.getUriSpec() != null) {
                uris.append(uris.length() == 0 ? "" : ", ").append('"')
                    .append(instance.buildUriSpec()).append('"');
            }
            Object zone = instance.getPayload() == null ? null : instance.getPayload().get("zone");
            payloads.append(sep).append('"').append(instance.getId()).append("\": ")
                .append(zone == null ? "null" : "\"" + zone + "\"");
        }
        ServiceInstance<Map> one = provider.getInstance();
        provider.close();
        discovery.close();
        return "{\"ids\": [" + ids + "], \"uris\": [" + uris + "], \"one\": "
            + (one == null ? "null" : "\"" + one.getId() + "\"") + ", \"zones\": {" + payloads + "}}";
    }
}
