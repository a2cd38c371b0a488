// --numa-binding: the CPUs (and memory nodes) each local rank is bound to, with torch's modes
// (node, socket, exclusive, core-complex), computed from the hwloc topology.
#pragma once
