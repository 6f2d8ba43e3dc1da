module sluice.example/worker

go 1.19
