package cgroup

var ParseProcCgroup = parseProcCgroup
