#!/usr/bin/env python3
"""Writes the hwloc XML topologies the --numa-binding tests load (hwloc's synthetic topologies
cannot hold PCI devices, so the GPU boxes are XML). Run it from this folder to regenerate:
`python3 make_topologies.py`; check a result with `lstopo --input FILE.xml`. (hwloc's built-in
XML parser takes no comments, so the descriptions live here.)

- gpu_box_2s8g.xml: 2 packages x 1 NUMA node x 2 L3 x 8 cores x 2 PUs, Linux numbering
  (PU = thread * 32 + package * 16 + core, so core siblings are N and N+32), 8 NVIDIA GPUs, 4
  behind each package (a DGX-like box).
- snc_box_2s8g.xml: the same cores, but each package split into 2 NUMA nodes (sub-NUMA
  clustering, 8 cores and one L3 each), 2 GPUs behind each NUMA node: socket != node.
- two_pu_2s2g.xml: 2 packages x 1 NUMA node x 1 L3 x 1 core x 1 PU (PU 0 and PU 1, as on a
  2-CPU test machine) with one GPU each: what a worker's real affinity is checked against.
"""


def mask(bits):
    """hwloc's bitmap text: 32-bit words, most significant first."""
    value = 0
    for b in bits:
        value |= 1 << b
    words = []
    while True:
        words.append(value & 0xFFFFFFFF)
        value >>= 32
        if value == 0:
            break
    return ",".join("0x%08x" % w for w in reversed(words))


class Writer:
    def __init__(self):
        self.lines = []
        self.gp = 0

    def sets(self, cpus, nodes):
        c, n = mask(cpus), mask(nodes)
        return (f'cpuset="{c}" complete_cpuset="{c}" nodeset="{n}" complete_nodeset="{n}" '
                f'gp_index="{self.next_gp()}"')

    def next_gp(self):
        self.gp += 1
        return self.gp

    def open(self, depth, text):
        self.lines.append("  " * depth + text)

    def close(self, depth):
        self.lines.append("  " * depth + "</object>")


def write_box(path, packages, nodes_per_package, cores_per_node, threads, gpus_per_node, buses):
    total_cores = packages * nodes_per_package * cores_per_node
    all_pus = range(total_cores * threads)
    all_nodes = range(packages * nodes_per_package)
    w = Writer()
    w.lines += ['<?xml version="1.0" encoding="UTF-8"?>',
                '<!DOCTYPE topology SYSTEM "hwloc2.dtd">',
                '<topology version="2.0">']
    c, n = mask(all_pus), mask(all_nodes)
    w.open(1, f'<object type="Machine" os_index="0" cpuset="{c}" complete_cpuset="{c}" '
              f'allowed_cpuset="{c}" nodeset="{n}" complete_nodeset="{n}" allowed_nodeset="{n}" '
              f'gp_index="{w.next_gp()}">')
    bus_iter = iter(buses)
    for p in range(packages):
        p_nodes = [p * nodes_per_package + i for i in range(nodes_per_package)]
        p_cores = range(p * nodes_per_package * cores_per_node,
                        (p + 1) * nodes_per_package * cores_per_node)
        p_pus = [t * total_cores + core for core in p_cores for t in range(threads)]
        w.open(2, f'<object type="Package" os_index="{p}" {w.sets(p_pus, p_nodes)}>')
        for node in p_nodes:
            n_cores = range(node * cores_per_node, (node + 1) * cores_per_node)
            n_pus = [t * total_cores + core for core in n_cores for t in range(threads)]
            depth = 3
            if nodes_per_package > 1:
                w.open(3, f'<object type="Group" {w.sets(n_pus, [node])} kind="0" subkind="0">')
                depth = 4
            w.open(depth, f'<object type="NUMANode" os_index="{node}" {w.sets(n_pus, [node])} '
                          f'local_memory="17179869184"/>')
            l3s = 2 if nodes_per_package == 1 and cores_per_node >= 2 else 1
            per_l3 = cores_per_node // l3s
            for l3 in range(l3s):
                l_cores = n_cores[l3 * per_l3:(l3 + 1) * per_l3]
                l_pus = [t * total_cores + core for core in l_cores for t in range(threads)]
                w.open(depth + 1, f'<object type="L3Cache" {w.sets(l_pus, [node])} '
                                  'cache_size="33554432" depth="3" cache_linesize="64" '
                                  'cache_associativity="16" cache_type="0">')
                for core in l_cores:
                    pus = [t * total_cores + core for t in range(threads)]
                    w.open(depth + 2, f'<object type="Core" os_index="{core}" '
                                      f'{w.sets(pus, [node])}>')
                    for pu in pus:
                        w.open(depth + 3, f'<object type="PU" os_index="{pu}" '
                                          f'{w.sets([pu], [node])}/>')
                    w.close(depth + 2)
                w.close(depth + 1)
            for _ in range(gpus_per_node):
                bus = next(bus_iter)
                w.open(depth + 1, f'<object type="Bridge" gp_index="{w.next_gp()}" '
                                  f'bridge_type="0-1" depth="0" bridge_pci="0000:[{bus}-{bus}]">')
                w.open(depth + 2, f'<object type="PCIDev" gp_index="{w.next_gp()}" '
                                  f'pci_busid="0000:{bus}:00.0" '
                                  'pci_type="0302 [10de:20b0] [10de:1450] a1" '
                                  'pci_link_speed="0.000000"/>')
                w.close(depth + 1)
            if nodes_per_package > 1:
                w.close(3)
        w.close(2)
    w.close(1)
    w.lines.append("</topology>")
    with open(path, "w") as f:
        f.write("\n".join(w.lines) + "\n")


EIGHT = ["07", "0f", "47", "4e", "87", "90", "b7", "bd"]
write_box("gpu_box_2s8g.xml", 2, 1, 16, 2, 4, EIGHT)
write_box("snc_box_2s8g.xml", 2, 2, 8, 2, 2, EIGHT)
write_box("two_pu_2s2g.xml", 2, 1, 1, 1, 1, ["01", "81"])
