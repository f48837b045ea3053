"""The cache's listeners by service (sentinel.cache.listeners): what a removal leaves behind."""

from sentinel.cache.listeners import Listeners
from sentinel.events import InstancesChanged


def test_a_services_entry_goes_with_its_last_listener():
    # Issue 53: services come and go for months; an empty entry per service ever listened to
    # grew with them.
    listeners = Listeners()
    for i in range(1000):
        listeners.add(f"svc{i}", lambda event: None)()
    assert listeners._by_service == {}


def test_removing_one_listener_keeps_the_others_and_a_later_add_is_heard():
    listeners = Listeners()
    heard: list[str] = []
    remove_a = listeners.add("api", lambda event: heard.append("a"))
    listeners.add("api", lambda event: heard.append("b"))
    remove_a()
    remove_a()  # twice is harmless
    listeners.emit("api", InstancesChanged("api"))
    assert heard == ["b"]
    listeners.add("api", lambda event: heard.append("c"))
    listeners.emit("api", InstancesChanged("api"))
    assert heard == ["b", "b", "c"]
