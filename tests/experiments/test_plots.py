"""Plot helpers that decide what a reader sees, without drawing anything."""

from experiments.plots import distance_bins


def test_reorder_distance_bins_run_from_the_smallest_distance():
    # As the endpoints' JSON holds them: sorted as text.
    stored = ["1", "1024+", "128-255", "16-31", "2-3", "256-511", "32-63", "4-7", "512-1023", "64-127", "8-15"]
    assert distance_bins([*stored, "2-3", "1"]) == [
        "1", "2-3", "4-7", "8-15", "16-31", "32-63", "64-127", "128-255", "256-511", "512-1023", "1024+"]
