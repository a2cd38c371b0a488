// Naming a worker killed by the kernel's OOM killer (cgroup v2 memory.events).
#pragma once
