// Package fuzz holds the project's go test -fuzz targets (make fuzz).
package fuzz
