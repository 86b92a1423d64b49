module github.com/omnicache/omnicache

go 1.26
