package capacity

import (
	"time"
)

// State is a reservation's (and each of its bookings') state.
type State string

// The states of a reservation: see the package doc's diagram.
const (
	Hold      State = "hold"      // booked, waiting for confirmation; lapses at ExpiresAt
	Confirmed State = "confirmed" // booked until released
	Released  State = "released"  // ended by its owner
	Expired   State = "expired"   // ended by the hold-expiry job
)

// Live reports whether s holds its devices (hold or confirmed).
func (s State) Live() bool { return s == Hold || s == Confirmed }

// NodeState is a node's state. Only active nodes take new bookings.
type NodeState string

// The node states.
const (
	NodeActive   NodeState = "active"
	NodeDraining NodeState = "draining" // keeps its bookings, takes no new ones
	NodeDown     NodeState = "down"     // keeps its bookings (the application decides), takes no new ones
)

// MaxDevices is the most devices one reservation can take.
const MaxDevices = 64

// Reservation is one tenant's booking of Devices devices of a pool over
// [Start, End): one booking per device, all in the reservation's state.
type Reservation struct {
	ID          int64      `db:"id"`
	PoolID      string     `db:"pool_id"`
	Tenant      string     `db:"tenant"`
	Start       time.Time  `db:"start_at"`
	End         time.Time  `db:"end_at"`
	State       State      `db:"state"`
	DeviceCount int        `db:"device_count"`
	LinkID      string     `db:"link_id"` // the link the devices were taken from, for a linked reservation
	Devices     []string   `db:"devices"` // the booked devices, sorted
	ExpiresAt   time.Time  `db:"expires_at"`
	Version     int64      `db:"version"` // goes up with every change; Extend names the version it read
	Extensions  int        `db:"extensions"`
	CreatedAt   time.Time  `db:"created_at"`
	ConfirmedAt *time.Time `db:"confirmed_at"`
	EndedAt     *time.Time `db:"ended_at"`

	// Retries, set by ReserveTx only, counts the devices it tried and lost to a
	// concurrent reservation (a 23P01 or a device found taken under its lock)
	// before it had all its devices.
	Retries int `db:"-"`
}

// Device is a device of a pool.
type Device struct {
	ID     string   `db:"id"`
	NodeID string   `db:"node_id"`
	PoolID string   `db:"pool_id"`
	Kind   string   `db:"kind"`
	Links  []string `db:"links"` // the links it belongs to, sorted
}

// PoolCapacity is a pool's capacity rollup: counts kept in step with every
// operation, equal to a recount at every commit (the sums of the pool's rollup
// stripes).
type PoolCapacity struct {
	PoolID        string `db:"pool_id"`
	Nodes         int    `db:"nodes"`
	ActiveNodes   int    `db:"active_nodes"`
	Devices       int    `db:"devices"`
	ActiveDevices int    `db:"active_devices"` // devices on active nodes: bookable
	Holds         int    `db:"holds"`          // live bookings (devices) in hold
	Confirmed     int    `db:"confirmed"`      // live bookings (devices) confirmed
}

// NodeResources is one node's resource counts.
type NodeResources struct {
	NodeID    string `db:"node_id"`
	PoolID    string `db:"pool_id"`
	Devices   int    `db:"devices"`
	Holds     int    `db:"holds"`
	Confirmed int    `db:"confirmed"`
}

// Quota is a tenant's quota in a pool: Used counts its live bookings (devices).
type Quota struct {
	Tenant string `db:"tenant"`
	PoolID string `db:"pool_id"`
	Limit  int    `db:"quota_limit"`
	Used   int    `db:"used"`
}
