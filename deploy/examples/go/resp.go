package main

// A minimal RESP2 client: enough to send commands to Redis and read their
// replies on one connection. Not safe for concurrent use: each goroutine owns
// its own redisConn.

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"
)

// redisTimeout bounds every command, so a Redis that stops answering turns
// into an error (and a reconnect) instead of a stuck slot. It must exceed the
// BLMOVE block time.
const redisTimeout = 10 * time.Second

// redisError is an error reply ("-ERR ..."). The connection is still usable.
type redisError string

func (e redisError) Error() string { return string(e) }

type redisConn struct {
	conn net.Conn
	r    *bufio.Reader
}

func dialRedis(addr string) (*redisConn, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	return &redisConn{conn: c, r: bufio.NewReader(c)}, nil
}

func (c *redisConn) Close() error { return c.conn.Close() }

// do sends one command and returns its reply: string (simple or bulk),
// int64, []interface{} or nil (nil bulk or nil array). An error reply is
// returned as a redisError; any other error means the connection is broken.
func (c *redisConn) do(args ...string) (interface{}, error) {
	if err := c.conn.SetDeadline(time.Now().Add(redisTimeout)); err != nil {
		return nil, err
	}
	buf := []byte("*" + strconv.Itoa(len(args)) + "\r\n")
	for _, a := range args {
		buf = append(buf, '$')
		buf = strconv.AppendInt(buf, int64(len(a)), 10)
		buf = append(buf, "\r\n"...)
		buf = append(buf, a...)
		buf = append(buf, "\r\n"...)
	}
	if _, err := c.conn.Write(buf); err != nil {
		return nil, err
	}
	v, err := c.read()
	if err != nil {
		return nil, err
	}
	if e, ok := v.(redisError); ok {
		return nil, e
	}
	return v, nil
}

// read parses one reply. Error replies are values here, so that an error
// inside an array (EXEC) does not stop us reading the rest of it.
func (c *redisConn) read() (interface{}, error) {
	line, err := c.r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return nil, fmt.Errorf("redis: malformed reply %q", line)
	}
	kind, text := line[0], line[1:len(line)-2]
	switch kind {
	case '+':
		return text, nil
	case '-':
		return redisError(text), nil
	case ':':
		return strconv.ParseInt(text, 10, 64)
	case '$', '*':
		n, err := strconv.Atoi(text)
		if err != nil {
			return nil, fmt.Errorf("redis: bad length %q", text)
		}
		if n < 0 {
			return nil, nil // nil bulk string or nil array
		}
		if kind == '$' {
			b := make([]byte, n+2)
			if _, err := io.ReadFull(c.r, b); err != nil {
				return nil, err
			}
			return string(b[:n]), nil
		}
		items := make([]interface{}, n)
		for i := range items {
			if items[i], err = c.read(); err != nil {
				return nil, err
			}
		}
		return items, nil
	}
	return nil, fmt.Errorf("redis: unknown reply type %q", kind)
}

// isRedisError tells an error reply (the command failed, the connection is
// fine) from a network or protocol error (the connection must be dropped).
func isRedisError(err error) bool {
	var re redisError
	return errors.As(err, &re)
}
