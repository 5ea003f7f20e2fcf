"""The roles of a run: producer, consumer, learner, colocated driver."""
