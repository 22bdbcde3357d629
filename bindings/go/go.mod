module github.com/kiln/kiln/bindings/go

go 1.19
