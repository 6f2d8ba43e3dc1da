module sluice.example/worker

go 1.19

require github.com/gomodule/redigo v1.8.3
