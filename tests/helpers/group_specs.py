"""The group specs the tests check against brute force (n <= 10): every kind of limit, unequal
groups, ranges, groups of one variable and one group, both limits at once."""

from circuits import GroupCapacity, GroupLimited

SPECS = [
    GroupLimited(6, 2, 3, 1),  # 3 groups of 2; both from one group
    GroupLimited(8, 3, 4, 2),
    GroupLimited(9, 3, [2, 3, 4], 2),  # unequal groups
    GroupLimited(8, None, 4, 2, kmin=1, kmax=4),  # a range
    GroupLimited(10, None, [1, 4, 2, 3], 2, kmin=0, kmax=5),
    GroupLimited(7, 2, [7], 1),  # one group: exactly-k
    GroupCapacity(8, 4, 4, 1),
    GroupCapacity(9, 4, [3, 3, 3], 2),
    GroupCapacity(8, None, [3, 5], 2, kmin=1, kmax=4),
    GroupCapacity(6, 3, 6, 1),  # groups of one variable
    GroupLimited(9, 3, 3, 2, capacity=2),  # both limits
    GroupLimited(10, None, [2, 3, 5], 2, capacity=2, kmin=2, kmax=4),
    GroupCapacity(10, 3, [4, 4, 2], 2, max_groups=2),
]
