"""Every weight publisher and subscriber fills the one seam the roles call (`coati_relay.exchange.publishing`): the
same method signatures and attributes, so the consumer and producer never probe which one they hold."""
from __future__ import annotations

import inspect

import pytest

from coati_relay.exchange.in_process import InProcessPublisher
from coati_relay.exchange.publishing import WeightPublisher, WeightSubscriber
from coati_relay.exchange.weight_sync import ObjectStorePublisher, ObjectStoreSubscriber
from coati_relay.exchange.weight_sync_collective import CollectivePublisher, CollectiveSubscriber


def _parameters(fn):
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("cls", [ObjectStorePublisher, CollectivePublisher, InProcessPublisher])
def test_each_publisher_has_the_seams_publish_and_device(cls):
    assert _parameters(cls.publish) == _parameters(WeightPublisher.publish)
    assert hasattr(cls, "device"), f"{cls.__name__} does not say which device it takes the weights from"


@pytest.mark.parametrize("cls", [ObjectStoreSubscriber, CollectiveSubscriber])
def test_each_subscriber_has_the_seams_fetch_and_timings(cls):
    assert _parameters(cls.fetch) == _parameters(WeightSubscriber.fetch)
    source = inspect.getsource(cls.__init__)
    assert "self.last_wait_s" in source and "self.last_transfer_s" in source


def test_the_object_store_pair_is_an_instance_of_the_seam():
    publisher, subscriber = ObjectStorePublisher(store=None), ObjectStoreSubscriber(store=None)
    assert isinstance(publisher, WeightPublisher) and publisher.device is None
    assert isinstance(subscriber, WeightSubscriber)
    assert not isinstance(subscriber, WeightPublisher)


def test_an_in_process_publisher_refuses_adapters_naming_itself():
    with pytest.raises(ValueError, match="InProcessPublisher.publish"):
        InProcessPublisher(backend=None).publish(1, adapters={})
